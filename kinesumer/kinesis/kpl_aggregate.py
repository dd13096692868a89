"""Packing user records into KPL aggregated records: the writing twin of :mod:`.kpl`.

The format (the KPL's, read by the KCL and by :func:`.kpl.to_records`): the four magic bytes,
a protobuf ``AggregatedRecord`` (schema from ``aws-kinesis-agg``: a table of partition keys, a
table of explicit hash keys, and the records, each naming its keys by index), then the MD5 of the
protobuf. :class:`Aggregate` grows one record at a time and knows its encoded size before each
addition (protobuf's wire sizes, computed, not estimated), so a producer can keep every aggregate
within Kinesis' 1 MiB per record.
"""

from __future__ import annotations

import hashlib

from .kpl import messages_pb2

MAGIC = b"\xf3\x89\x9a\xc2"
_DIGEST_SIZE = 16


def varint_size(value: int) -> int:
    """Bytes protobuf spends on ``value`` as a varint."""
    size = 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size


def _field_size(length: int) -> int:
    """A length-delimited field of ``length`` bytes: tag, length, payload."""
    return 1 + varint_size(length) + length


class Aggregate:
    """User records packed for one Kinesis entry, in the order they were added."""

    def __init__(self) -> None:
        self._keys: dict[str, int] = {}
        self._hash_keys: dict[str, int] = {}
        self._records: list[tuple[int, int | None, bytes]] = []
        self._body_size = 0
        self.first_key: str | None = None

    def __len__(self) -> int:
        return len(self._records)

    def size_with(self, data: bytes, key: str, explicit_hash_key: str | None = None) -> int:
        """The whole aggregate's size in bytes (magic, protobuf, digest) if this record were
        added."""
        return MAGIC_AND_DIGEST + self._body_size + self._growth(data, key, explicit_hash_key)

    def _growth(self, data: bytes, key: str, explicit_hash_key: str | None) -> int:
        growth = 0
        key_index = self._keys.get(key)
        if key_index is None:
            key_index = len(self._keys)
            growth += _field_size(len(key.encode("utf-8")))
        record = 1 + varint_size(key_index) + _field_size(len(data))
        if explicit_hash_key is not None:
            hash_index = self._hash_keys.get(explicit_hash_key)
            if hash_index is None:
                hash_index = len(self._hash_keys)
                growth += _field_size(len(explicit_hash_key))
            record += 1 + varint_size(hash_index)
        return growth + _field_size(record)

    def add(
        self,
        data: bytes,
        key: str,
        explicit_hash_key: str | None = None,
        size_with: int | None = None,
    ) -> None:
        """Add a record; ``size_with``: what :meth:`size_with` just said for it (spares
        computing it again)."""
        if size_with is None:
            self._body_size += self._growth(data, key, explicit_hash_key)
        else:
            self._body_size = size_with - MAGIC_AND_DIGEST
        if self.first_key is None:
            self.first_key = key
        key_index = self._keys.setdefault(key, len(self._keys))
        hash_index = None
        if explicit_hash_key is not None:
            hash_index = self._hash_keys.setdefault(explicit_hash_key, len(self._hash_keys))
        self._records.append((key_index, hash_index, data))

    @property
    def size(self) -> int:
        return MAGIC_AND_DIGEST + self._body_size

    def encode(self) -> bytes:
        """The Kinesis record's data: magic, protobuf, MD5."""
        message = messages_pb2.AggregatedRecord()
        message.partition_key_table.extend(self._keys)
        message.explicit_hash_key_table.extend(self._hash_keys)
        for key_index, hash_index, data in self._records:
            record = message.records.add()
            record.partition_key_index = key_index
            if hash_index is not None:
                record.explicit_hash_key_index = hash_index
            record.data = data
        body: bytes = message.SerializeToString()
        return MAGIC + body + hashlib.md5(body).digest()


MAGIC_AND_DIGEST = len(MAGIC) + _DIGEST_SIZE
