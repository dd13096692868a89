"""The future ``Producer.put`` returns: a :class:`concurrent.futures.Future` whose lock is made
only when someone looks at it.

Why: a standard ``Future`` is ten objects the cyclic garbage collector tracks (the future, a
``threading.Condition`` with its deque and five bound lock methods, two lists). A producer holds
one per buffered record, up to ``max_buffered_records``, and every object that survives into the
oldest generation makes the next full collection (which walks every tracked object of the
process, botocore's models included) come sooner: measured, full collections were about three
quarters of the producer's CPU per record. A :class:`RecordFuture` is one tracked object until
its holder calls any of its methods (``result``, ``done``, ``add_done_callback``, ``cancel``,
``concurrent.futures.wait`` / ``as_completed``, ``asyncio.wrap_future``...): that first look
makes the standard lock, waiter and callback lists, and from then on it is a standard future.

The producer resolves it with :meth:`RecordFuture.settle`. Both the first look and ``settle``
take one module-wide lock, so they are ordered: either the look came first (``settle`` then
resolves through the standard ``set_result``, waking waiters and running callbacks), or
``settle`` came first (no waiter nor callback can exist yet; the look then finds the future
done). The standard future's own attribute names are checked once at import; on a Python
whose ``Future`` keeps other ones, :func:`new_future` makes standard futures instead.
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import Future, InvalidStateError
from typing import Any, TypeVar

T = TypeVar("T")

#: What ``Future.__init__`` sets (CPython 3.10 to 3.13): the names this module stands in for.
_STANDARD_FIELDS = frozenset(
    {"_condition", "_state", "_result", "_exception", "_waiters", "_done_callbacks"}
)
#: Orders a first look at a future against its ``settle`` (see the module docstring). What it
#: guards only reads and assigns attributes: nothing allocates or calls Python code while held.
_MAKING = threading.Lock()


class RecordFuture(Future[T]):
    """A ``concurrent.futures.Future`` that is one object until someone looks at it."""

    def __init__(self) -> None:  # no super().__init__(): its lock is what is deferred
        self._state = _PENDING
        self._result: Any = None
        self._exception: BaseException | None = None
        self._made: tuple[threading.Condition, list[Any], list[Any]] | None = None

    def _make(self) -> tuple[threading.Condition, list[Any], list[Any]]:
        made = self._made
        if made is None:
            # Built before taking the lock: an allocation may start a garbage collection, whose
            # finalizers (or gc callbacks, or a signal handler at the Condition's __init__) may
            # look at another unlooked future in this thread, and _MAKING is not reentrant.
            fresh: tuple[threading.Condition, list[Any], list[Any]] = (
                threading.Condition(),
                [],
                [],
            )
            with _MAKING:
                made = self._made
                if made is None:
                    made = self._made = fresh
        return made

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        return self._make()[0]

    @property
    def _waiters(self) -> list[Any]:  # type: ignore[override]
        return self._make()[1]

    @property
    def _done_callbacks(self) -> list[Any]:
        return self._make()[2]

    def settle(self, result: T | None = None, error: BaseException | None = None) -> None:
        """Resolve to ``result``, or to ``error`` when given; nothing if already done (say,
        cancelled). Unlooked-at, this is two assignments under a lock; else ``set_result`` /
        ``set_exception``, which wake waiters and run callbacks."""
        with _MAKING:
            if self._made is None:
                if self._state == _PENDING:
                    if error is None:
                        self._result = result
                    else:
                        self._exception = error
                    self._state = _FINISHED
                return
        with contextlib.suppress(InvalidStateError):
            if error is None:
                self.set_result(result)  # type: ignore[arg-type]
            else:
                self.set_exception(error)


def _standard_states() -> tuple[str, str] | None:
    """The standard future's pending and finished state values, or None when its attributes
    are not the ones :class:`RecordFuture` stands in for."""
    probe: Future[None] = Future()
    if set(vars(probe)) != _STANDARD_FIELDS:
        return None
    pending = probe._state
    probe.set_result(None)
    return pending, probe._state


_STATES = _standard_states()
_PENDING, _FINISHED = _STATES or ("PENDING", "FINISHED")
#: False on a Python whose Future this module does not know: :func:`new_future` is standard.
LAZY = _STATES is not None


def new_future() -> Future[Any]:
    """The future for one record: a :class:`RecordFuture` where this Python allows it."""
    return RecordFuture() if LAZY else Future()


def settle(future: Any, result: Any = None, error: BaseException | None = None) -> None:
    """Resolve a record's future (either face's: a RecordFuture, a standard or an asyncio
    future) to ``result`` or ``error``, unless it is done already."""
    if type(future) is RecordFuture:
        future.settle(result, error)
        return
    # A standard future may be cancelled by its holder's thread between done() and set_*: that
    # raises here, on the producer's loop, amid settling one answer's records.
    with contextlib.suppress(InvalidStateError):
        if not future.done():
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)
