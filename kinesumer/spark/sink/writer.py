"""The Spark sink: every task writes its rows through a :class:`~kinesumer.Producer` and
flushes before it reports success, so a batch commits only once its rows are in Kinesis.

Columns: ``data`` (binary or string, UTF-8), ``partition_key`` (string), optional
``explicit_hash_key`` (string) and ``stream`` (string: routes each row; else the ``stream``
option). Options: ``stream``, the producer's AWS options (``region``, ``kinesis_region``,
``kinesis_endpoint``, ``sts_endpoint``, ``role_arn``, ``external_id``) and ``aggregate``,
``ordering``, ``delivery_timeout``, ``linger``. They and the columns are checked when Spark makes
the writer, with :class:`~kinesumer.ConfigError` naming what to fix: at ``save()``; for a
streaming query when it plans its first micro-batch (``start()`` returns; the query stops with
the error before it writes a row). At ``save()`` the stream the ``stream`` option names is
checked too (:class:`~kinesumer.StreamNotFoundError`, :class:`~kinesumer.AccessDeniedError`);
in a streaming query, and for streams routed by a ``stream`` column, a missing stream fails the
tasks that write to it (their records' :class:`~kinesumer.StreamNotFoundError`, in the task's
:class:`~kinesumer.FlushError`).

At least once: a row is written again when Spark runs its task again (a task failed after some
of its rows were written, or a speculative copy) or replays a micro-batch after a restart (the
batch was written, the checkpoint of the query was not). Deduplicate downstream on a key of the
row's own (e.g. an id in the payload).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...aws import RequestStats
from ...errors import ConfigError
from ...kinesis.reader import KinesisReader
from ...producer import Producer
from ...producer.base import BaseProducer
from ...producer.core import producer_transport
from ...stream_refs import TABLE_STREAM_WRITES, is_dynamodb_stream
from ..source.aliases import suggest
from ..source.errors import named_error_first
from ..source.options import accounts_from_json, endpoints_from_json

_STRINGS = (
    "region",
    "kinesis_region",
    "kinesis_endpoint",
    "sts_endpoint",
    "role_arn",
    "external_id",
)
_NUMBERS = ("delivery_timeout", "linger")
#: Spark's own options, which it passes to the sink too.
_SPARKS = frozenset({"path", "checkpointlocation", "queryname"})
#: JSON objects, as the source's: each account's role, each region's endpoint.
_JSONS = {"accounts": accounts_from_json, "kinesis_endpoints": endpoints_from_json}
_KNOWN = frozenset({"stream", "aggregate", "ordering", *_SPARKS, *_STRINGS, *_NUMBERS, *_JSONS})


@dataclass(frozen=True)
class SinkOptions:
    """The sink's options, parsed: the default stream and the producer's keywords."""

    stream: str | None
    producer: dict[str, Any] = field(default_factory=dict)


#: The AWS Labs and Databricks connectors' sink options that mean one of ours (lower case, as
#: Spark hands them over): a user switching connectors changes only the format's name.
SINK_ALIASES: dict[str, str] = {
    "kinesis.streamname": "stream",
    "streamname": "stream",
    "streamarn": "stream",
    "kinesis.region": "region",
    "kinesis.kinesisregion": "kinesis_region",
    "kinesis.endpointurl": "kinesis_endpoint",
    "endpoint": "kinesis_endpoint",
    "kinesis.stsrolearn": "role_arn",
    "rolearn": "role_arn",
    "roleexternalid": "external_id",
    "externalid": "external_id",
    "kinesis.stsendpointurl": "sts_endpoint",
    "stsendpoint": "sts_endpoint",
}


def _canonical(options: Mapping[str, str]) -> dict[str, str]:
    """``options`` with lower-case names and the other connectors' names as ours; a name given
    twice (ours and an alias) with different values is refused."""
    values: dict[str, str] = {}
    given_as: dict[str, str] = {}
    for key, value in options.items():
        name = key.lower()
        ours = SINK_ALIASES.get(name, name)
        if ours in values and values[ours] != value:
            raise ConfigError(
                ours,
                f"is given twice with different values (as {given_as[ours]!r} and {key!r})",
                "sink",
            )
        values[ours], given_as[ours] = value, key
    return values


def _hint(name: str, known: list[str]) -> str:
    """`` (did you mean 'x'?)`` for a sink option ``name`` nearly spelled as one of ours or an
    alias (``stream_name``), else the source's hint when it names a sink option."""
    squashed = re.sub(r"[^a-z0-9]", "", name.lower().removeprefix("kinesis."))
    for candidate in (*known, *SINK_ALIASES):
        if re.sub(r"[^a-z0-9]", "", candidate.removeprefix("kinesis.")) == squashed:
            return f" (did you mean {SINK_ALIASES.get(candidate, candidate)!r}?)"
    meant = suggest(name, known)
    return f" (did you mean {meant!r}?)" if meant in known else ""


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    values = _canonical(options)
    unknown = sorted(set(values) - _KNOWN)
    if unknown:
        known = sorted(_KNOWN - _SPARKS)
        raise ConfigError(
            unknown[0],
            f"not an option of the kinesumer sink{_hint(unknown[0], known)} ({', '.join(known)})",
            "sink",
        )
    producer: dict[str, Any] = {key: values[key] for key in _STRINGS if values.get(key)}
    for key in _NUMBERS:
        if key in values:
            try:
                producer[key] = float(values[key])
            except ValueError:
                raise ConfigError(
                    key, f"a number of seconds, not {values[key]!r}", "sink"
                ) from None
    if "aggregate" in values:
        if values["aggregate"].lower() not in ("true", "false"):
            raise ConfigError("aggregate", f"true or false, not {values['aggregate']!r}", "sink")
        producer["aggregate"] = values["aggregate"].lower() == "true"
    if "ordering" in values:
        producer["ordering"] = values["ordering"]
    for key, parse in _JSONS.items():
        if values.get(key):
            producer[key] = parse(values[key])
    Producer.check_options(**producer)  # the producer's own checks, on the driver
    stream = values.get("stream") or None
    if stream is not None and is_dynamodb_stream(stream):
        # The load check would find it (DynamoDB Streams describes it); every task's put would
        # then fail.
        raise ConfigError("stream", f"{stream!r}: {TABLE_STREAM_WRITES}", "sink")
    return SinkOptions(stream, producer)


def check_columns(schema: Any, options: SinkOptions) -> None:
    types = {f.name: f.dataType.simpleString() for f in schema.fields}
    if types.get("data") not in ("binary", "string"):
        raise ConfigError(
            "data", f"the sink needs a binary or string column 'data' (columns: {types})", "sink"
        )
    if types.get("partition_key") != "string":
        raise ConfigError(
            "partition_key",
            f"the sink needs a string column 'partition_key' (columns: {types})",
            "sink",
        )
    for optional in ("explicit_hash_key", "stream"):
        if optional in types and types[optional] != "string":
            raise ConfigError(optional, f"column {optional!r} must be a string", "sink")
    if options.stream is None and "stream" not in types:
        raise ConfigError(
            "stream", "give the stream: .option('stream', ...) or a 'stream' column", "sink"
        )


def check_stream(options: SinkOptions) -> None:
    """The stream the ``stream`` option names exists and can be reached, asked once on the
    driver: a missing stream fails ``save()`` / ``start()`` by name, not every task of the batch
    (each of which would fail its records only after the producer's own retries)."""
    if options.stream is None:
        return
    config = BaseProducer(**options.producer).config  # the producer's region, endpoint, role

    async def check(stream: str) -> None:
        async with producer_transport(config) as kinesis:  # a stream ARN: its account's
            reader = KinesisReader(kinesis, RequestStats(), config.effective_kinesis_region)
            await reader.check_stream(stream)

    asyncio.run(check(options.stream))


@dataclass
class SinkCommit:
    """What a task reports: the rows it wrote (all of them, or it failed)."""

    rows: int


def write_rows(options: SinkOptions, rows: Iterator[Any]) -> SinkCommit:
    """Put every row, flush, report: a record that could not be written fails the task
    (FlushError), and Spark runs it again or fails the batch."""
    count = 0
    producer = Producer(**options.producer)
    try:
        for row in rows:
            fields = row.asDict()
            data = fields["data"]
            if isinstance(data, str):
                data = data.encode("utf-8")
            stream: str = fields.get("stream") or options.stream or ""
            producer.put(
                stream,
                data,
                partition_key=fields["partition_key"],
                explicit_hash_key=fields.get("explicit_hash_key"),
            )
            count += 1
        producer.flush()
    finally:
        producer.close()
    return SinkCommit(count)


def sink_writer(options: Mapping[str, str], schema: Any, overwrite: bool, streaming: bool) -> Any:
    """The batch or streaming writer for ``df.write`` / ``df.writeStream``."""
    from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

    with named_error_first():  # the named error alone, not a Python traceback, reaches Spark
        if overwrite:
            raise ConfigError("mode", "Kinesis is append-only: use mode('append')", "sink")
        parsed = parse_sink_options(options)
        check_columns(schema, parsed)
        if not streaming:
            # A streaming query makes its writer again at every micro-batch's commit (pyspark's
            # python_streaming_sink_runner): a DescribeStreamSummary there (20 calls/s per
            # account) could fail a written batch; its first batch's tasks name a missing
            # stream instead.
            check_stream(parsed)

    @dataclass
    class Commit(WriterCommitMessage):
        rows: int

    class BatchWriter(DataSourceWriter):
        def write(self, iterator: Iterator[Any]) -> Any:
            with named_error_first():
                return Commit(write_rows(parsed, iterator).rows)

    class StreamWriter(DataSourceStreamWriter):
        def write(self, iterator: Iterator[Any]) -> Any:
            with named_error_first():
                return Commit(write_rows(parsed, iterator).rows)

        def commit(self, messages: list[Any], batchId: int) -> None:
            """Every task flushed before reporting: the rows are written."""

        def abort(self, messages: list[Any], batchId: int) -> None:
            """Rows of the tasks that finished stay written (at least once)."""

    return StreamWriter() if streaming else BatchWriter()
