"""Handlers, not just iterators: what ``Kinesumer.run`` / ``AsyncKinesumer.run`` take.

::

    from kinesumer.handlers import Batch, DeadLetter, Retry

    with Kinesumer(config) as consumer:
        consumer.run(["orders"], handle, concurrency=64, ordering="key",
                     on_failure=DeadLetter("orders-dlq", retry=Retry(attempts=5)))

The public names: :class:`Batch` (batch handlers), the failure policies (:class:`Retry`,
:class:`Stop`, :class:`Block`, :class:`Discard`, :class:`DeadLetter`, :class:`RetryLater`) and
:class:`Message` (what a handler gets with ``decode=``). Modules: ``options`` (run()'s checked
arguments), ``scheduler`` (per-key ordering, pure), ``progress`` (the low-water mark per shard),
``dispatch``, ``threads`` and ``tasks`` (the runners of the two faces), ``policies``, ``invoke``,
``reporting``, ``decode``, ``deadletter`` and ``retry_later`` (what happens in and around one
handler call), ``age`` (``max_record_age`` on Kinesis's clock) and ``registry`` (handlers added
and removed while a run runs: ``Kinesumer.add_handler``).
"""

from __future__ import annotations

from .decode import Message
from .options import Batch, RunOptions
from .policies import Block, DeadLetter, Discard, FailurePolicy, Retry, RetryLater, Stop

__all__ = [
    "Batch",
    "Block",
    "DeadLetter",
    "Discard",
    "FailurePolicy",
    "Message",
    "Retry",
    "RetryLater",
    "RunOptions",
    "Stop",
]
