"""Which admitted records may start now, and in which calls: per-key ordered scheduling.

Pure: no threads, no clocks, no I/O. The runner (threads.py, tasks.py) admits records with
:meth:`Scheduler.add`, asks :meth:`Scheduler.take` for the next call whenever a handler slot is
free, and reports each finished call with :meth:`Scheduler.done`. The rules:

- A record's *key* says what it must be ordered with: ``(stream, partition key)`` for
  ``ordering="key"``, ``(stream, shard id)`` for ``"shard"``, nothing for ``"none"`` (every
  record independent). Records of one key start in the order they were added (sequence order),
  and a key never has two calls in flight: its next records wait until its call is done.
- At most ``max_in_flight`` records are admitted and not done (:meth:`room` says how many more
  may be added); the runner stops reading while there is no room.
- A call takes up to ``batch_size`` ready records: several records of one key go in one call,
  in order, when that key has nothing in flight; with ``one_key_per_call`` (a sink: a call's
  position is committed with it) a call never mixes keys, hence never spans shards.
- Time is the runner's business: :meth:`take` with ``force=False`` returns a call only when it
  is full; the runner passes ``force=True`` once the batch's ``max_wait`` has passed.

Worked example, ordering="key", batch_size=2: add a1 a2 b1 a3 (letter = key). take() gives
[a1, a2] (key a busy), take() gives [b1], take() gives nothing (a3 waits for a); done([a1, a2])
makes a ready again and take() gives [a3].
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class Call(Generic[T]):
    """Records that go to one handler call, and the keys they hold busy until it is done."""

    __slots__ = ("items", "keys")

    def __init__(self, items: list[T], keys: list[Hashable]) -> None:
        self.items = items
        self.keys = keys

    def __repr__(self) -> str:
        return f"Call({self.items!r})"


class Scheduler(Generic[T]):
    def __init__(
        self,
        ordered: bool,
        max_in_flight: int,
        batch_size: int = 1,
        one_key_per_call: bool = False,
    ) -> None:
        if max_in_flight < 1 or batch_size < 1:
            raise ValueError("max_in_flight and batch_size must be at least 1")
        self._ordered = ordered
        self._max = max_in_flight
        self._batch = batch_size
        self._one_key = one_key_per_call
        #: Admitted and not done (waiting or in flight).
        self.admitted = 0
        # ordered: records waiting per key, keys that may start (waiting and not busy), in the
        # order they became ready, and the keys with a call in flight. A key is in _ready
        # exactly when it has waiting records and is not busy, so it is never there twice.
        self._waiting: dict[Hashable, deque[T]] = {}
        self._ready: deque[Hashable] = deque()
        self._busy: set[Hashable] = set()
        self._ready_records = 0
        # unordered: every waiting record may start.
        self._free: deque[T] = deque()

    # -- admission -----------------------------------------------------------------------------
    def room(self) -> int:
        """How many more records may be admitted now."""
        return self._max - self.admitted

    def add(self, item: T, key: Hashable = None) -> None:
        """Admit ``item`` (records of one key in sequence order). The caller checks room()."""
        self.admitted += 1
        if not self._ordered:
            self._free.append(item)
            return
        queue = self._waiting.get(key)
        if queue is None:
            queue = self._waiting[key] = deque()
        queue.append(item)
        if key not in self._busy:
            if len(queue) == 1:
                self._ready.append(key)
            self._ready_records += 1

    # -- calls ---------------------------------------------------------------------------------
    def ready(self) -> int:
        """Records that could start now (in one or several calls)."""
        return self._ready_records if self._ordered else len(self._free)

    def _full_call_ready(self) -> bool:
        if not self._ordered:
            return len(self._free) >= self._batch
        if self._one_key:
            return bool(self._ready) and len(self._waiting[self._ready[0]]) >= self._batch
        return self._ready_records >= self._batch

    def take(self, force: bool = True) -> Call[T] | None:
        """The next call, or None when nothing may start (or, unless ``force``, when the call
        would not be full)."""
        if not force and not self._full_call_ready():
            return None
        limit = self._batch
        if not self._ordered:
            free = self._free
            if not free:
                return None
            if limit == 1:
                return Call([free.popleft()], [])
            return Call([free.popleft() for _ in range(min(limit, len(free)))], [])
        items: list[T] = []
        keys: list[Hashable] = []
        ready, waiting = self._ready, self._waiting
        while ready and len(items) < limit:
            key = ready.popleft()
            queue = waiting[key]
            self._ready_records -= len(queue)
            for _ in range(min(len(queue), limit - len(items))):
                items.append(queue.popleft())
            if not queue:  # else the rest waits, not ready: its key is busy now
                del waiting[key]
            self._busy.add(key)
            keys.append(key)
            if self._one_key:
                break
        return Call(items, keys) if items else None

    def done(self, call: Call[T]) -> None:
        """``call`` finished (its records are done, or given up): its keys may go on."""
        self.admitted -= len(call.items)
        for key in call.keys:
            self._busy.discard(key)
            queue = self._waiting.get(key)
            if queue:
                self._ready.append(key)
                self._ready_records += len(queue)

    # -- dropping ------------------------------------------------------------------------------
    def drop(self, where: Callable[[T], bool]) -> list[T]:
        """Forget every waiting (not started) record for which ``where`` holds (records of a
        lost lease) and return them. The others keep their order."""
        dropped: list[T] = []
        if not self._ordered:
            dropped = [item for item in self._free if where(item)]
            if dropped:
                self._free = deque(item for item in self._free if not where(item))
        else:
            for key in list(self._waiting):
                queue = self._waiting[key]
                cut = [item for item in queue if where(item)]
                if not cut:
                    continue
                dropped.extend(cut)
                kept = deque(item for item in queue if not where(item))
                if key not in self._busy:
                    self._ready_records -= len(cut)
                if kept:
                    self._waiting[key] = kept
                else:
                    del self._waiting[key]
                    if key not in self._busy:
                        self._ready.remove(key)
        self.admitted -= len(dropped)
        return dropped

    @property
    def idle(self) -> bool:
        """Nothing admitted and not done."""
        return self.admitted == 0
