"""The two producing faces over one core: :class:`Producer` (blocking, ``sync.py``) and
:class:`AsyncProducer` (``aio.py``), both on ``base.py``. The core (``core.py``) admits records
into a bounded buffer and runs a writer per stream (``stream.py``) that batches per shard
(``batching.py``, where per-key order is argued), paces each shard and retries refused entries.
"""

from .aio import AsyncProducer
from .records import PutResult
from .stats import LatencySummary, ProducerStats
from .sync import Producer

__all__ = ["AsyncProducer", "LatencySummary", "Producer", "ProducerStats", "PutResult"]
