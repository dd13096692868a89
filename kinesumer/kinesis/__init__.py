"""Kinesis access: shard listing with lineage, rate-limited reading, KPL unpacking."""

from .kpl import to_records
from .reader import KinesisReader, ShardBatch

__all__ = ["KinesisReader", "ShardBatch", "to_records"]
