"""moto's SplitShard made to behave as Kinesis's, for tests that reshard a stream on moto in
server mode (whose server is a thread of the test process, so patching its models patches it).

moto 5's split is not a reshard a reader can follow: it moves the parent's records into the
two children (put again, under new sequence numbers: a reader that had read them reads them
again), keeps routing new records to the closed parent (the first shard whose hash range holds
the key, open or not), and its GetRecords never ends a closed shard (``NextShardIterator`` is
never null), so a reader waiting for the parent's end before reading the children waits forever.

:func:`aws_like_splits` patches, for one test: the parent keeps its records and closes (its
``EndingSequenceNumber`` its last record's), new records go to open shards only, and GetRecords
past the last record of a closed shard answers a null ``NextShardIterator``, as Kinesis does.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest


def aws_like_splits(patch: pytest.MonkeyPatch) -> None:
    """Patch moto's Kinesis models (undone with ``patch``) so that splits behave as Kinesis's."""
    from moto.kinesis import models
    from moto.kinesis.utils import decompose_shard_iterator

    moved_split = models.Stream.split_shard
    routing = models.Stream.get_shard_for_key
    reading = models.KinesisBackend.get_records

    def split_shard(self: Any, shard_to_split: str, new_starting_hash_key: str) -> None:
        parent = self.shards[shard_to_split]
        kept = parent.records
        parent.records = {}  # nothing for moto's split to move into the children
        try:
            moved_split(self, shard_to_split, new_starting_hash_key)  # its checks, the children
        finally:
            parent.records = kept

    def get_shard_for_key(self: Any, partition_key: str, explicit_hash_key: str) -> Any:
        shard = routing(self, partition_key, explicit_hash_key)  # moto's checks, first match
        if shard is None or shard.is_open:
            return shard
        if explicit_hash_key:
            key = int(explicit_hash_key)
        else:
            key = int(hashlib.md5(partition_key.encode("utf-8")).hexdigest(), 16)
        for open_shard in self.shards.values():
            if open_shard.is_open and open_shard.starting_hash <= key < open_shard.ending_hash:
                return open_shard
        return None

    def get_records(self: Any, stream_arn: str | None, shard_iterator: str, limit: Any) -> Any:
        next_iterator, records, behind = reading(self, stream_arn, shard_iterator, limit)
        stream_name, shard_id, last = decompose_shard_iterator(next_iterator)
        stream = self.describe_stream(stream_arn=stream_arn, stream_name=stream_name)
        shard = stream.get_shard(shard_id)
        if not shard.is_open and int(last) >= shard.get_max_sequence_number():
            next_iterator = None  # the end of a closed shard: Kinesis answers null
        return next_iterator, records, behind

    patch.setattr(models.Stream, "split_shard", split_shard)
    patch.setattr(models.Stream, "get_shard_for_key", get_shard_for_key)
    patch.setattr(models.KinesisBackend, "get_records", get_records)
