"""KPL aggregates as the KPL writes them (aws-kinesis-agg's aggregator), for tests."""

from __future__ import annotations

from aws_kinesis_agg.aggregator import RecordAggregator


def aggregate(pairs: list[tuple[str, bytes]]) -> bytes:
    """One aggregated Kinesis record's data holding ``pairs`` (partition key, data)."""
    agg = RecordAggregator()
    for key, data in pairs:
        assert agg.add_user_record(key, data) is None
    _, _, blob = agg.clear_and_get().get_contents()
    return bytes(blob)
