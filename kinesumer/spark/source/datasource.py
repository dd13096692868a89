"""``spark.readStream.format("kinesumer")``: the data source, its stream reader, and
:func:`read_stream`, which builds one from a :class:`~kinesumer.Config`.

::

    from kinesumer.spark import KinesumerDataSource
    spark.dataSource.register(KinesumerDataSource)
    df = (spark.readStream.format("kinesumer")
            .option("app", "orders-etl").option("dynamodb_table", "kinesumer-state")
            .option("streams", "orders,payments").option("region", "eu-west-1")
            .load())

The reader delegates planning to :class:`~.planner.Planner` (driver side, a group member) and
reading to :func:`~.executor.read_partition` (executors). Options are checked in ``schema()``,
which Spark calls at ``load()``: a bad option, a missing table or stream fails there with the
library's named error in the message.
"""

from __future__ import annotations

import asyncio
import atexit
import signal
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from botocore.exceptions import NoRegionError

from ...aws import AwsClients, RequestStats
from ...config import Config
from ...errors import ConfigError
from ...kinesis import KinesisReader
from ...kinesis.places import places_for
from ...kinesis.routing import routing_over
from ...statestore import DynamoDBStateStore
from ..arrow import SCHEMA_DDL
from .compat import (
    DataSource,
    DataSourceStreamReader,
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
    require_source_api,
)
from .driver.planner import Planner
from .errors import named_error_first, named_errors
from .executor.read import read_partition
from .offsets import SourceOffset
from .options import (
    SourceOptions,
    parse_options,
    redact_in_active_session,
    redact_sensitive_options,
    to_options,
)
from .partition import ShardPartition

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: The source's columns (those of :class:`~kinesumer.Record`, as foreach_batch has them).
SCHEMA = SCHEMA_DDL


class KinesumerDataSource(DataSource):
    """The ``kinesumer`` format: options as in :mod:`.options`, columns as :data:`SCHEMA`."""

    @classmethod
    def name(cls) -> str:
        # Spark asks for the name when the application registers the source, in its own
        # process: the moment to keep role_arn / external_id out of the session's plans.
        redact_in_active_session()
        return "kinesumer"

    def writer(self, schema: Any, overwrite: bool) -> Any:
        """``df.write.format("kinesumer")``: the sink (:mod:`kinesumer.spark.sink`)."""
        from ..sink import sink_writer

        return sink_writer(self.options, schema, overwrite, streaming=False)

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        """``df.writeStream.format("kinesumer")``: the sink (:mod:`kinesumer.spark.sink`)."""
        from ..sink import sink_writer

        return sink_writer(self.options, schema, overwrite, streaming=True)

    def schema(self) -> str:
        # Called once, at load(): the place to fail early, with the option's name.
        with named_error_first():
            check_resources(self._parsed())
        return SCHEMA

    def streamReader(self, schema: Any) -> KinesumerStreamReader:
        with named_error_first():
            return KinesumerStreamReader(self._parsed())

    def _parsed(self) -> SourceOptions:
        require_source_api()
        return parse_options(self.options)


class KinesumerStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Spark's calls, handed to the planner (driver side) or the executor module."""

    def __init__(self, options: SourceOptions) -> None:
        self._planner = Planner(options)
        self._exit_hooks = False
        self._initial_offset: dict[str, Any] | None = None
        # Spark makes a reader per run of the query: a restart is a new one.
        self._run = uuid.uuid4().hex
        self._planned: tuple[str, int] | None = None  # the batch latestOffset planned last

    @property
    def options(self) -> SourceOptions:
        """The parsed options (all that is pickled for executors)."""
        return self._planner.options

    def __getstate__(self) -> dict[str, Any]:
        # Pickled for executors before it joins anything: ship the options only.
        return {"options": self._planner.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._planner = Planner(state["options"])
        self._exit_hooks = False
        self._initial_offset = None
        self._run = uuid.uuid4().hex
        self._planned = None

    def _leave_on_exit(self) -> None:
        """In the query's long-lived source worker (the only process that calls the offset
        methods), make the end of the process a graceful leave: ``stop()`` at exit (atexit),
        and SIGTERM turned into ``SystemExit`` so the runner's ``finally: reader.stop()`` runs
        (by default SIGTERM ends Python at once: to the group a crash, its shards unread for
        ``client_timeout``). A SIGKILL cannot be caught: then the group sees a crash."""
        if self._exit_hooks:
            return
        self._exit_hooks = True
        atexit.register(self.stop)
        main = threading.current_thread() is threading.main_thread()
        if main and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _exit_on_sigterm)

    @named_errors
    def initialOffset(self) -> dict[str, Any]:
        self._leave_on_exit()
        # Spark asks again for batch 0's start until that batch commits: one query id (and
        # group) for the run, not a new one each time (a group joined, then left after a
        # handoff wait). A restart is a new reader: there the stored offset decides the group.
        if self._initial_offset is None:
            self._initial_offset = self._planner.initial_offset()
        return self._initial_offset

    @named_errors
    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        self._leave_on_exit()
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        latest = self._planner.latest_offset(start, max_rows)
        end = SourceOffset.from_json(latest)
        if end.batch != SourceOffset.from_json(start).batch:  # a new batch, planned here
            self._planned = (end.query, end.batch)
        return latest

    @named_errors
    def getDefaultReadLimit(self) -> ReadLimit:
        bound = self._planner.options.max_records_per_trigger
        return ReadMaxRows(bound) if bound else ReadAllAvailable()

    @named_errors
    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self._planner.report_latest()

    @named_errors
    def prepareForTriggerAvailableNow(self) -> None:
        self._planner.prepare_available_now()

    @named_errors
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[ShardPartition]:
        offset = SourceOffset.from_json(end)
        here = self._planned == (offset.query, offset.batch)
        if here:
            # Once: Spark plans a batch's partitions again for each further job that reads it
            # (another action on a foreachBatch DataFrame, a self-join): its ledger items exist
            # by then, so those tasks look them up first and replay.
            self._planned = None
        return [replace(p, run=self._run, planned_here=here) for p in self._planner.partitions(end)]

    @named_errors
    def read(self, partition: ShardPartition) -> Iterator[Any]:  # type: ignore[override]
        return read_partition(partition)

    @named_errors
    def commit(self, end: dict[str, Any]) -> None:
        self._planner.commit(end)

    @named_errors
    def stop(self) -> None:
        _hold_sigterm()
        self._planner.close()


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM in the source worker: unwind (``reader.stop()`` in the runner's ``finally``,
    then atexit). A second SIGTERM while leaving is ignored: the leave is short."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def _hold_sigterm() -> None:
    """Ignore SIGTERM while the member leaves (``stop()``). The runner's ``finally`` may call
    ``stop()`` on its own, before any signal: when the JVM closed the worker's socket first
    (``spark.stop()`` interrupts the query's thread, which closes its channel), and sends its
    SIGTERM (``destroy()``) only after. Raised inside the leave, that SIGTERM's ``SystemExit``
    would abort it halfway (the member's loop stops with the leave unfinished, and the group
    sees a crash: the shards wait ``client_timeout``)."""
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(signal.SIGTERM) is _exit_on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def check_resources(options: SourceOptions) -> None:
    """The state table and every stream exist (else the library's named errors)."""

    async def check() -> None:
        stats = RequestStats()
        clients = AwsClients(options.config, stats)
        await clients.open()
        try:
            config = options.config
            await DynamoDBStateStore(
                clients.dynamodb, config.dynamodb_table, config.app, stats
            ).check()
            kinesis = routing_over(clients, places_for(config, clients))
            reader = KinesisReader(kinesis, stats, config.effective_kinesis_region)
            for stream in options.streams:
                await reader.check_stream(stream)
        finally:
            await clients.close()

    try:
        asyncio.run(check())
    except ConfigError as exc:
        if not isinstance(exc.__cause__, NoRegionError):
            raise
        raise ConfigError(
            "region",
            "is required: no region option and no AWS region where the source runs "
            "(AWS_REGION / AWS_DEFAULT_REGION or a profile of Spark's Python workers): "
            ".option('region', 'eu-west-1')",
        ) from None


def register(spark: SparkSession) -> None:
    """Make ``format("kinesumer")`` known to ``spark`` (without this, Spark answers
    ``DATA_SOURCE_NOT_FOUND``) and keep ``role_arn`` / ``external_id`` out of its plans."""
    require_source_api()
    redact_sensitive_options(spark)
    spark.dataSource.register(KinesumerDataSource)


def read_stream(
    spark: SparkSession, config: Config, streams: Iterable[str], **options: Any
) -> DataFrame:
    """``spark.readStream.format("kinesumer")`` for ``config`` and ``streams``, checked here.

    ``options`` are the source's own (``max_records_per_trigger=...``, ``idle_poll_interval=...``).
    Raises :class:`~kinesumer.ConfigError`, :class:`~kinesumer.StreamNotFoundError` or
    :class:`~kinesumer.StateTableNotFoundError` in the caller's process, before Spark starts.
    Registers :class:`KinesumerDataSource` with the session.
    """
    require_source_api()
    strings = to_options(config, tuple(streams), **options)
    check_resources(parse_options(strings))
    register(spark)
    reader = spark.readStream.format("kinesumer").options(**strings)
    frame: DataFrame = reader.load()
    return frame


def option_strings(config: Config, streams: Iterable[str], **options: Any) -> Mapping[str, str]:
    """The ``.option(...)`` strings for ``config``, ``streams`` and source ``options``."""
    return to_options(config, tuple(streams), **options)
