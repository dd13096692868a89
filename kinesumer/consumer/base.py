"""What the two faces share: argument checks, the engine behind them, and their documentation.

As httpx's ``BaseClient`` under ``Client`` and ``AsyncClient``, :class:`BaseKinesumer` holds
everything that is not about blocking versus awaiting: the constructor's checks, the engine and
its rebalance hooks, ``client_id``, :meth:`~BaseKinesumer.lag`, :meth:`~BaseKinesumer.stats`, the
checks before a poll, and the rule deciding whether a closing member's record in hand counts as
processed. The faces, :class:`~kinesumer.Kinesumer` (``sync.py``) and
:class:`~kinesumer.AsyncKinesumer` (``aio.py``), add only how their calls reach the engine's event
loop. The docstrings of the methods both faces spell (``consume``, ``poll``...) are written once
here and attached with :func:`shared_doc`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from ..config import Config, check_streams
from ..engine.broadcast import BroadcastEngine
from ..engine.engine import Engine
from ..engine.hooks import Hook, RebalanceHooks
from ..stats import ConsumerStats

F = TypeVar("F", bound=Callable[..., object])

CONSUME = """Join the group (or change streams), then yield records from this member's shards
until the consumer is closed. Errors from the engine are raised here, to the caller."""

SUBSCRIBE = """Join the group for ``streams`` (or change them) without iterating: for ``poll()``."""

POLL = """Up to ``max_records`` records from this member's shards, waiting at most ``timeout``
seconds; after ``subscribe()``. In auto-commit mode a poll's records count as processed at the
next poll; otherwise at ``commit()``."""

COMMIT = """Mark every record delivered so far as processed and write the checkpoints now."""

REFRESH = """Consume a different set of streams from now on."""

CLOSE = """Hand every shard off gracefully and leave the group.

Called in auto-commit mode from where the records are consumed (``Kinesumer``: the thread
iterating ``consume()`` or calling ``poll()``; ``AsyncKinesumer``: the task iterating
``consume()``), the record held there counts as processed; from elsewhere, the handoff waits up
to ``handoff_timeout`` for it. With
``discard=True`` (the application failed on what it holds) only what was processed or committed
is checkpointed and nothing is waited for; the rest is delivered again. Leaving the face's
``with`` block on an exception closes with ``discard=True``."""


def shared_doc(doc: str) -> Callable[[F], F]:
    """Give a face's method the docstring both faces share (written once, above)."""

    def attach(method: F) -> F:
        method.__doc__ = doc
        return method

    return attach


class BaseKinesumer:
    """A member of a consumer group: what :class:`~kinesumer.Kinesumer` and
    :class:`~kinesumer.AsyncKinesumer` have in common. Not used on its own.

    With ``auto_commit=True`` (the default) a record counts as processed when the application
    asks for the next one; with ``auto_commit=False`` when it calls ``commit()``.
    ``on_assigned`` / ``on_revoked`` hear which ``(stream, shard_id)`` this member starts and
    stops reading (see :mod:`kinesumer.engine.hooks`).
    """

    def __init__(
        self,
        config: Config,
        *,
        on_assigned: Hook | None = None,
        on_revoked: Hook | None = None,
    ) -> None:
        if not isinstance(config, Config):
            raise TypeError(
                f"{type(self).__name__} needs a kinesumer.Config, got {type(config).__name__}"
            )
        engine = BroadcastEngine if config.broadcast else Engine
        self._engine = engine(config, RebalanceHooks(on_assigned, on_revoked))
        # Where the application iterates (the face's :meth:`_here` when it began), if it does.
        self._iterating_in: object | None = None

    @property
    def client_id(self) -> str:
        """This member's id in the group (``Config.client_id``, or host-pid-random)."""
        return self._engine.client_id

    def lag(self) -> dict[tuple[str, str], int | None]:
        """``(stream, shard_id)`` -> MillisBehindLatest of each shard this member reads."""
        return self._engine.lag()

    def stats(self) -> ConsumerStats:
        """A snapshot of what this member is doing (see :class:`~kinesumer.ConsumerStats`);
        safe to call from any thread."""
        return self._engine.snapshot()

    # -- for the faces ----------------------------------------------------------------------
    @staticmethod
    def _stream_names(streams: Iterable[str]) -> tuple[str, ...]:
        return check_streams(streams)

    def _check_subscribed(self) -> None:
        """``poll()`` reads what ``subscribe()`` joined for."""
        if not self._engine.started:
            raise RuntimeError("call subscribe(streams) before poll()")

    def _here(self) -> object:
        """Where the caller runs, as the face tells places apart (a thread, a task)."""
        raise NotImplementedError

    def _iterating_here(self) -> None:
        self._iterating_in = self._here()

    def _in_hand_done(self) -> bool:
        """Whether a closing member's record in hand counts as processed: only in auto-commit
        mode, and only when the application closes from where it iterates (it asked for no
        more, as if it had asked for the next record); from elsewhere it may still be working."""
        iterating_in = self._iterating_in
        return (
            self._engine.config.auto_commit
            and iterating_in is not None
            and iterating_in == self._here()
        )


def engine_of(consumer: BaseKinesumer) -> Engine:
    """Test seam: the engine behind a face, for the few tests that must act where no public
    call reaches (a member killed without a handoff: ``Engine.abort()``; a delivery fence that
    lapses at a chosen moment: ``Engine.cursor.fence``). Named so that such tests say what they
    do and read no private attribute. Applications have no use for it: the engine is internal
    (:mod:`kinesumer.engine`) and changes without notice."""
    return consumer._engine
