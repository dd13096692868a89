"""KPL aggregates as the KPL writes them (aws-kinesis-agg's aggregator), for tests."""

from __future__ import annotations

import hashlib

import aws_kinesis_agg
from aws_kinesis_agg.aggregator import RecordAggregator

from kinesumer.kinesis.kpl import (
    messages_pb2,
)


def aggregate(pairs: list[tuple[str, bytes]]) -> bytes:
    """One aggregated Kinesis record's data holding ``pairs`` (partition key, data)."""
    agg = RecordAggregator()
    for key, data in pairs:
        assert agg.add_user_record(key, data) is None
    _, _, blob = agg.clear_and_get().get_contents()
    return bytes(blob)


OUTER = "outer-key"


def framed(body: bytes) -> bytes:
    """``body`` as a Kinesis record's data: KPL magic, the body, its (correct) MD5."""
    magic: bytes = aws_kinesis_agg.MAGIC
    return magic + body + hashlib.md5(body).digest()


def body_of(keys: list[str], users: list[tuple[int, bytes]]) -> bytes:
    aggregate = messages_pb2.AggregatedRecord()
    aggregate.partition_key_table.extend(keys)
    for index, data in users:
        user = aggregate.records.add()
        user.partition_key_index = index
        user.data = data
    return bytes(aggregate.SerializeToString())


def bad_utf8_aggregate() -> bytes:
    """The reported one: a partition key table entry that is not UTF-8, under a correct MD5."""
    body = body_of(["k"], [(0, b"secret")]).replace(b"\x0a\x01k", b"\x0a\x01\xff")
    return framed(body)
