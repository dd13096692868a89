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

import dataclasses
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from ..config import Config, check_streams, check_streams_for
from ..errors import ConfigError, ConsumerClosedError
from ..group.hooks import Hook, RebalanceHooks
from ..handlers.counters import HandlerCounters
from ..handlers.invoke import Invocation
from ..handlers.options import RunOptions, run_options
from ..handlers.policies import RetryLater, dead_letter_streams
from ..handlers.registry import AddedHandler, HandlerSet, KeyOfCheck
from ..kinesis.transport import KinesisTransport, given_transport
from ..models import Record
from ..read.broadcast import BroadcastEngine
from ..read.engine import Engine
from ..statestore.base import GroupState
from ..stats import ConsumerStats
from ..topics import Topic, TopicList, run_streams

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


RUN = """Join the group for ``streams`` and call ``handler`` with every record of this member's
shards until :meth:`close` is called from another thread (the calls in flight finish and are
checkpointed, then ``run`` returns) or the handler fails outside its policy (then the consumer
closes, nothing at or after the failing record is checkpointed, and the handler's exception is
raised here, with a note naming the handler and the record).

- ``concurrency``: handler calls at once (``Kinesumer``: worker threads; ``AsyncKinesumer``:
  tasks). ``concurrency=1`` with ``ordering="shard"`` calls a plain handler on this thread.
- ``ordering``: ``"key"``: records of one partition key one at a time, in sequence order, keys
  in parallel; ``"shard"`` (default): one shard's records in order; ``"none"``: any order.
- ``max_in_flight``: records read and not yet done, per member (default: twice what the
  handler slots take at once, at least 100); reading pauses at the bound.
- ``batch``: :class:`~kinesumer.handlers.Batch` (``max_size``, ``max_wait``,
  ``bisect_on_error``): the handler gets a list of records.
- ``on_failure``: a failure policy (``Stop()`` by default: no retry, ``run`` raises; ``Retry``,
  ``Block``, ``Discard``, ``DeadLetter``, ``RetryLater``: see :mod:`kinesumer.handlers`).
- ``decode``: ``"json"``, a type (dataclass, msgspec Struct, TypedDict, pydantic model) or a
  callable ``bytes -> T``: the handler gets a :class:`~kinesumer.handlers.Message`.
- ``sink``: an exactly-once sink (:mod:`kinesumer.sinks`; needs ``ordering="shard"``): the handler
  is called as ``handler(record_or_batch, tx)`` inside the sink's transaction.
- ``name``: the handler's name in ``stats().handled``, metrics and dead letters (default: its
  ``__qualname__``).
- ``max_record_age``: seconds; a record older than this by Kinesis's clock (its arrival
  timestamp against what reads showed of that clock, see :mod:`kinesumer.handlers.age`) goes
  to the failure policy instead of the handler, counted ``too_old`` (not with ``Block``).

A shard's checkpoint only moves to the highest position below which every record is done, so
a crash loses nothing and delivers again only records in flight or not yet checkpointed; a
graceful handoff waits (up to ``handoff_timeout``) for the shard's records read so far.
Bad arguments raise :class:`~kinesumer.ConfigError` naming the argument, before joining (so do
a sink or ``RetryLater`` in broadcast mode, and a stream outside the consumer's ``topics=``).
One ``run`` per consumer, on a consumer that ``consume()``/``subscribe()`` did not join with
(``RuntimeError``); a ``close()`` while it joins makes it return. A call waiting (backing off,
blocking, a retry-later record's due time) gives up when the run closes or its shard is handed
off: its records are the next owner's."""


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
    stops reading (see :mod:`kinesumer.group.hooks`). ``topics``: when given, the only
    streams (names or :class:`~kinesumer.Topic` objects) this consumer reads, as a producer's
    ``topics=``: ``consume``, ``subscribe``, ``refresh``, ``run`` and ``add_handler`` refuse any
    other (and a Topic of another type for a listed stream) with ConfigError, before joining.
    The streams a failure policy names (``RetryLater``, ``DeadLetter``) are not checked.
    ``state``: the group's state table instead of ``config``'s DynamoDB one
    (:class:`kinesumer.testing.MemoryState` in a test: a whole group in one process).
    ``kinesis``: the Kinesis this member reads, and its handlers' failure policies write to,
    instead of AWS's (:class:`kinesumer.testing.MemoryKinesis` in a test).
    """

    def __init__(
        self,
        config: Config,
        *,
        topics: Iterable[str | Topic[Any]] | None = None,
        on_assigned: Hook | None = None,
        on_revoked: Hook | None = None,
        state: GroupState | None = None,
        kinesis: KinesisTransport | None = None,
    ) -> None:
        if not isinstance(config, Config):
            raise TypeError(
                f"{type(self).__name__} needs a kinesumer.Config, got {type(config).__name__}"
            )
        kinesis = given_transport(kinesis, type(self).__name__)
        # Checked before the engine exists: a bad list costs nothing to refuse.
        self._topics = None if topics is None else TopicList(topics, type(self).__name__)
        engine = BroadcastEngine if config.broadcast else Engine
        hooks = RebalanceHooks(on_assigned, on_revoked)
        self._engine = engine(config, hooks, state=state, kinesis=kinesis)
        # run() handlers' outcome counters, by handler name (stats().handled).
        self._handled: dict[str, HandlerCounters] = {}
        # Where the application iterates (the face's :meth:`_here` when it began), if it does.
        self._iterating_in: object | None = None
        # Held while run() runs: a second run() at once would take the same records.
        self._running = threading.Lock()
        # Handlers added while run() runs (add_handler), and the streams run() reads.
        self._added = HandlerSet()
        self._run_names: tuple[str, ...] | None = None

    @property
    def client_id(self) -> str:
        """This member's id in the group (``Config.client_id``, or host-pid-random)."""
        return self._engine.client_id

    @property
    def topics(self) -> frozenset[str] | None:
        """The streams this consumer may read (its ``topics=``), or None: any stream."""
        return None if self._topics is None else frozenset(self._topics.by_stream)

    def lag(self) -> dict[tuple[str, str], int | None]:
        """``(stream, shard_id)`` -> MillisBehindLatest of each shard this member reads."""
        return self._engine.lag()

    def stats(self) -> ConsumerStats:
        """A snapshot of what this member is doing (see :class:`~kinesumer.ConsumerStats`);
        safe to call from any thread."""
        stats = self._engine.snapshot()
        if not self._handled:
            return stats
        handled = {name: counters.snapshot() for name, counters in list(self._handled.items())}
        return dataclasses.replace(stats, handled=handled)

    def add_handler(
        self,
        name: str,
        handler: Callable[..., Any],
        *,
        streams: Topic[Any] | Iterable[str | Topic[Any]] | None = None,
        keys: Iterable[str] | None = None,
        key_of: Callable[[Record], str] | None = None,
        on_failure: object = None,
        decode: object = None,
    ) -> None:
        """Add the handler ``name``, while ``run()`` runs (or before): every record read from
        now on of ``streams`` (names or topics; default: every stream the run reads) whose key
        is in ``keys`` (default: every record) is given to it too, one record per call, after
        ``run()``'s handler, in the same order. The key is the partition key, or what
        ``key_of(record)`` returns (a key in the payload). It has its own failure policy
        (``on_failure``; not ``RetryLater``), ``decode``, counters (``stats().handled[name]``,
        metrics) and dead letters. Records read before it was added never reach it. A
        record's checkpoint moves only once every handler it was read for has finished it.
        Safe from any thread. ``ConfigError`` for a bad argument, a name in use, or a stream
        the run does not read (checked here once ``run()`` was called, by ``run()`` for a
        handler added before it; see :mod:`kinesumer.handlers.registry`)."""
        names: list[str] | None = None
        if streams is not None:
            items = _as_list(streams)
            names, decode = run_streams(items, decode)
            names = list(self._stream_names(names, "add_handler", items))
            unread = sorted(set(names) - set(self._run_names or names))
            if unread:
                raise ConfigError(
                    "streams", f"{', '.join(unread)} not read by the run", "add_handler"
                )
        options = run_options(
            handler,
            concurrency=1,
            ordering="shard",
            max_in_flight=None,
            batch=None,
            on_failure=on_failure,
            decode=decode,
            sink=None,
            name=name,
            is_async=self._handlers_are_async,
        )
        if isinstance(options.on_failure, RetryLater):
            raise ConfigError(
                "on_failure",
                "RetryLater needs its stream read by the run; use DeadLetter, Discard, Stop "
                "or Block for an added handler",
                "add_handler",
            )
        engine = self._engine
        counters = self._handled.get(name)
        if counters is None:
            counters = self._handled[name] = HandlerCounters(name, engine.metrics)
        check = None if keys is None or key_of is None else KeyOfCheck(name, key_of)
        invocation = Invocation(
            handler,
            options,
            engine.client_factory(),
            counters,
            self._handlers_are_async,
            client_id=self.client_id,
            refuse=check,
        )
        wanted_keys = None if keys is None else frozenset(keys)
        only = None if names is None else frozenset(names)
        try:
            self._added.add(AddedHandler(name, invocation, only, wanted_keys, check))
        except ValueError:
            raise ConfigError(
                "name", f"a handler named {name!r} was added already", "add_handler"
            ) from None

    def remove_handler(self, name: str) -> None:
        """Remove the handler ``name`` added with :meth:`add_handler`: records not yet given to
        it skip it, a call of it in flight finishes; the other handlers and the checkpoints
        go on. ``KeyError`` when no handler of that name is added."""
        self._added.remove(name)

    # -- for the faces ----------------------------------------------------------------------
    #: Whether handlers are coroutine functions (the async face) or plain ones.
    _handlers_are_async = False

    def _stream_names(
        self, streams: Iterable[str], where: str, items: Iterable[Any] | None = None
    ) -> tuple[str, ...]:
        """The checked names of the streams a call (``where``) reads: valid, and within
        ``topics=`` (``items``: the call's own names and topics, when it took topics)."""
        names = check_streams(streams, kinesis_arns=True)
        check_streams_for(self._engine.config, names)
        if self._topics is not None:
            self._topics.refuse_others(names if items is None else items, where)
        return names

    def _check_subscribed(self) -> None:
        """``poll()`` reads what ``subscribe()`` joined for."""
        if not self._engine.started:
            raise RuntimeError("call subscribe(streams) before poll()")

    def _prepare_run(
        self,
        streams: Topic[Any] | Iterable[str | Topic[Any]],
        handler: Callable[..., Any],
        run_arguments: dict[str, Any],
        is_async: bool,
    ) -> tuple[RunOptions, Invocation, tuple[str, ...], tuple[str, ...]]:
        """``run()``'s checks (ConfigError naming the argument), before anything starts: the
        options, the invocation, the streams to join (with the policy's retry-later stream),
        and the streams failed records are written to that the run does not read (checked
        at the join); the sink is attached to the engine. Topics give their names and
        type."""
        items = _as_list(streams)
        streams, run_arguments["decode"] = run_streams(items, run_arguments.get("decode"))
        names = self._stream_names(streams, "run", items)
        for added in self._added.current:  # added before run(): their streams are checked now
            unread = sorted((added.streams or frozenset()) - set(names))
            if unread:
                raise ConfigError(
                    "streams",
                    f"{', '.join(unread)} not read by the run, but add_handler({added.name!r}) "
                    "was given it: read it in run() or remove_handler() first",
                    "run",
                )
        self._run_names = names
        options = run_options(handler, is_async=is_async, **run_arguments)
        counters = self._handled.get(options.name)
        if counters is None:
            counters = self._handled[options.name] = HandlerCounters(
                options.name, self._engine.metrics
            )
        engine = self._engine
        if options.sink is not None and engine.config.broadcast:
            raise ConfigError(
                "sink",
                "broadcast mode has no claims, hence no lease to fence a sink's commit with; "
                "use a sink in a consumer group (Config(broadcast=False))",
                "run",
            )
        if isinstance(options.on_failure, RetryLater) and engine.config.broadcast:
            raise ConfigError(
                "on_failure",
                "every broadcast member reads the retry-later stream, so each would handle "
                "every member's retries; use DeadLetter, Discard or Block in broadcast mode",
                "run",
            )
        read_back = sorted(set(dead_letter_streams(options.on_failure)) & set(names))
        if read_back:
            raise ConfigError(
                "on_failure",
                f"writes failed records to {', '.join(read_back)}, which this run reads: "
                "they would come back to the handler as envelopes; use streams of their own",
                "run",
            )
        invocation = Invocation(
            handler,
            options,
            engine.client_factory(),
            counters,
            is_async,
            client_id=self.client_id,
        )
        if invocation.extra_streams:  # the policy's own (retry-later): not within topics=
            names = check_streams([*names, *invocation.extra_streams], kinesis_arns=True)
        policies = [options.on_failure, *(a.invocation.policy for a in self._added.current)]
        written = {stream for policy in policies for stream in dead_letter_streams(policy)}
        writes_to = tuple(sorted(written - set(names)))
        self._begin_run()  # before the sink's claim hook goes into a running engine
        if options.sink is not None:
            try:
                options.sink.attach(engine)
            except BaseException:
                self._end_run()
                raise
        return options, invocation, names, writes_to

    def _begin_run(self) -> None:
        """One run() at a time, and none on a consumer that consume()/subscribe() joined with:
        both would take the same records; none on a closed one. The face calls
        :meth:`_end_run` when run() ends."""
        if not self._running.acquire(blocking=False):
            raise RuntimeError("run() is running on this consumer already")
        engine = self._engine
        if engine.lifecycle.closing_or_closed:
            self._running.release()
            raise ConsumerClosedError("this consumer was closed; create a new one")
        if engine.started:
            self._running.release()
            raise RuntimeError(
                "run() joins the group itself: not on a consumer that consume() or "
                "subscribe() joined with (make another consumer)"
            )

    def _end_run(self) -> None:
        self._running.release()

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


def _as_list(streams: Any) -> list[Any]:
    """A call's ``streams`` as a list: one name or topic, or several (read once)."""
    return [streams] if isinstance(streams, (str, Topic)) else list(streams)


def engine_of(consumer: BaseKinesumer) -> Engine:
    """Test seam: the engine behind a face, for the few tests that must act where no public
    call reaches (a member killed without a handoff: ``Engine.abort()``; a delivery fence that
    lapses at a chosen moment: ``Engine.cursor.fence``). Named so that such tests say what they
    do and read no private attribute. Applications have no use for it: the engine is internal
    (:mod:`kinesumer.read`) and changes without notice."""
    return consumer._engine
