"""Handlers added and removed while ``run()`` runs, by name, optionally filtered by key.

::

    consumer.add_handler("audit", audit, streams=["orders"], keys={"order-7"},
                         on_failure=DeadLetter("audit-dlq"))
    ...
    consumer.remove_handler("audit")

Each added handler has its own failure policy, counters (``stats().handled[name]``, metrics)
and dead letters: an :class:`~.invoke.Invocation` of its own, called one record at a time.

When it applies. The runner takes a :meth:`HandlerSet.current` snapshot for every record it
admits (with the record, in the runner's thread), so a handler added later starts with the
records read after it was added, never with records already admitted. A record is done (its
checkpoint may move past it) once ``run()``'s handler and every added handler of its snapshot
that wants it have finished it: they are called one after the other in the call that holds the
record, ``run()``'s handler first, then the added ones in the order they were added, so per-key
(or per-shard) order holds for each of them. Removing a handler marks it removed: records not
yet given to it skip it (done for it), a call of it in flight finishes; the others and the
checkpoints are not disturbed. A removed name may be added again (a new handler).

Failures: an added handler's own policy decides (a ``Stop`` stops the whole run, as the main
handler's would; ``DeadLetter``/``Discard`` dispose of the record for that handler only), also
for a record its ``key_of`` raises on (a :class:`KeyOfError`, not retried; the handler is not
called with it: a payload without the key must not stop every restart, nor be skipped silently).
When a call is abandoned (the shard handed off while it waited) its records are redelivered to
the next owner, which calls every handler again: at-least-once per handler, as for the main one.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from ..models import Record
from ..read.progress import ShardLease
from .policies import KeyOfError

if TYPE_CHECKING:
    from .policies import FailurePolicy


class AddedInvocation(Protocol):
    """How an added handler is called (kinesumer.handlers.invoke.Invocation)."""

    #: Its failure policy (the streams it writes dead letters to are checked at the join).
    policy: FailurePolicy

    def call_sync(
        self, records: list[Record], lease: ShardLease, stopping: threading.Event
    ) -> None: ...

    async def call_async(
        self, records: list[Record], lease: ShardLease, stopping: asyncio.Event
    ) -> None: ...

    async def close_async(self) -> None: ...


@dataclass(eq=False)
class AddedHandler:
    """One added handler: its name, what it wants, and how it is called."""

    name: str
    invocation: AddedInvocation
    streams: frozenset[str] | None = None
    keys: frozenset[str] | None = None
    key_of: KeyOfCheck | None = None
    #: Set by remove_handler: records not yet given to it skip it.
    removed: bool = field(default=False)

    def wants(self, record: Record) -> bool:
        """Whether ``record`` goes to this handler (its streams and key filter)."""
        if self.removed:
            return False
        if self.streams is not None and record.stream not in self.streams:
            return False
        if self.keys is None:
            return True
        if self.key_of is None:
            return record.partition_key in self.keys
        # None: key_of raised (a payload without the key). The handler's own failure policy
        # decides (its invocation finds the KeyOfError), never a stop of the whole run nor a
        # silent skip.
        key = self.key_of.key(record)
        return key is None or key in self.keys


class KeyOfCheck:
    """An added handler's ``key_of``, run once per record: the filter (:meth:`AddedHandler.wants`)
    asks for the key; the invocation, before calling the handler, asks for the
    :class:`KeyOfError` the filter met on that record, if any (a record's entry leaves when
    asked for, so only records whose key_of raised are held, until their call)."""

    def __init__(self, name: str, key_of: Callable[[Record], str]) -> None:
        self.name, self.key_of = name, key_of
        self._failed: dict[tuple[str, str, str, int], Exception] = {}

    def key(self, record: Record) -> str | None:
        """``key_of(record)``; None when it raised (remembered for :meth:`__call__`)."""
        try:
            return self.key_of(record)
        except Exception as error:
            self._failed[identity(record)] = error
            return None

    def __call__(self, record: Record) -> KeyOfError | None:
        error = self._failed.pop(identity(record), None)
        return None if error is None else KeyOfError(self.name, record, error)


def identity(record: Record) -> tuple[str, str, str, int]:
    """A record's place: stream, shard, sequence and sub-sequence number."""
    return record.stream, record.shard_id, record.sequence_number, record.sub_sequence_number


#: No added handler: what an entry admitted with none carries.
NONE: tuple[AddedHandler, ...] = ()


class HandlerSet:
    """The added handlers of one consumer, by name. Thread-safe: added and removed from any
    thread; :attr:`current` is an immutable snapshot, read without a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.current: tuple[AddedHandler, ...] = NONE
        #: Every handler ever added (removed ones too): what a run closes when it ends.
        self.every: list[AddedHandler] = []

    def add(self, handler: AddedHandler) -> None:
        """Add ``handler``; ``ValueError`` when its name is taken by one not removed."""
        with self._lock:
            if any(h.name == handler.name for h in self.current):
                raise ValueError(handler.name)
            self.current = (*self.current, handler)
            self.every.append(handler)

    def remove(self, name: str) -> AddedHandler:
        """Remove the handler ``name`` (``KeyError`` when there is none) and return it."""
        with self._lock:
            for handler in self.current:
                if handler.name == name:
                    handler.removed = True
                    self.current = tuple(h for h in self.current if h is not handler)
                    return handler
        raise KeyError(name)

    def names(self) -> list[str]:
        return [h.name for h in self.current]


def wanted(
    snapshots: Iterable[tuple[Record, tuple[AddedHandler, ...]]],
) -> list[tuple[AddedHandler, list[Record]]]:
    """For one call (its records in order, each with the snapshot taken when it was admitted):
    each added handler with the records it wants, in order; handlers in the order they were
    added; those that want none left out. Read at call time, so a handler removed meanwhile
    wants nothing."""
    out: dict[AddedHandler, list[Record]] = {}
    for record, added in snapshots:
        for handler in added:
            if handler.wants(record):
                out.setdefault(handler, []).append(record)
    return list(out.items())
