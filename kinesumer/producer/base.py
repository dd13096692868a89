"""What the two producing faces share: construction (the ``Config`` vocabulary for reaching AWS,
:class:`~.options.ProducerOptions` for the rest), the checks every ``put`` makes, topics, and
``stats()``. Only blocking versus awaiting differs between :class:`~kinesumer.Producer` and
:class:`~kinesumer.AsyncProducer`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from ..accounts import AccountAccess
from ..config import Config
from ..errors import ConfigError, InvalidRecordError
from ..kinesis.transport import KinesisTransport, given_transport
from ..observability.metrics import metrics_for
from ..stream_refs import TABLE_STREAM_WRITES, is_dynamodb_stream, is_kinesis_name
from ..topics import Topic, TopicList, outside_topics
from .core import ProducerCore
from .options import ProducerOptions
from .records import PendingRecord, check_record, check_stream_arn
from .stats import ProducerStats

#: Stand-ins for the consumer-only Config fields: a producer never reads the state table.
_APP = "kinesumer-producer"
_NO_TABLE = "kinesumer-producer-no-table"


class BaseProducer:
    """Puts records to Kinesis streams in batches, per shard, in the background.

    Reaching AWS: ``region``, ``kinesis_region``, ``kinesis_endpoint``, ``sts_endpoint``,
    ``role_arn``, ``external_id``, ``accounts``, ``kinesis_endpoints`` mean what they mean in
    :class:`~kinesumer.Config` (or pass a ``Config`` to :meth:`from_config`). A stream is a
    name (the config's own account and region) or a Kinesis stream's ARN (its account and
    region: through ``accounts[<account>]``'s role when listed; a DynamoDB table's stream ARN
    is :class:`~kinesumer.errors.ReadOnlyStreamError`). Batching, bounds, pacing and retries: see
    :class:`~kinesumer.producer.options.ProducerOptions` (``linger``, ``max_buffered_records``,
    ``max_buffered_bytes``, ``block``, ``delivery_timeout``, ``ordering``, ``aggregate``,
    ``max_in_flight``, ``shard_records_per_second``, ``shard_bytes_per_second``,
    ``retry_backoff``, ``max_retry_backoff``). ``topics``: when given, the only streams (or
    :class:`~kinesumer.Topic` objects) this producer accepts (ConfigError for a bad list; the
    consumer's ``topics=`` is the same list, :mod:`kinesumer.topics`).

    ``kinesis``: a :class:`~kinesumer.kinesis.transport.KinesisTransport` every Kinesis call
    goes to instead of AWS, such as ``kinesumer.testing.MemoryKinesis`` in a test: no AWS
    client is opened (the settings for reaching AWS are still accepted, and unused). ::

        memory = MemoryKinesis()
        memory.create_stream("orders", shards=4)
        with Producer(region="eu-west-1", kinesis=memory) as producer:
            producer.put("orders", b"one", partition_key="order-1")
        [record.data for record in memory.records("orders")]  # [b"one"]
    """

    def __init__(
        self,
        *,
        region: str | None = None,
        kinesis_region: str | None = None,
        kinesis_endpoint: str | None = None,
        sts_endpoint: str | None = None,
        role_arn: str | None = None,
        external_id: str | None = None,
        accounts: Mapping[str, AccountAccess] | None = None,
        kinesis_endpoints: Mapping[str, str] | None = None,
        topics: Iterable[str | Topic[Any]] | None = None,
        config: Config | None = None,
        linger: float = 0.05,
        max_buffered_records: int = 100_000,
        max_buffered_bytes: int = 64 * 1024 * 1024,
        block: bool = True,
        delivery_timeout: float = 120.0,
        ordering: Literal["key", "none"] = "key",
        aggregate: bool = False,
        max_in_flight: int = 8,
        shard_records_per_second: int | None = 1000,
        shard_bytes_per_second: int | None = 1024 * 1024,
        retry_backoff: float = 0.05,
        max_retry_backoff: float = 2.0,
        kinesis: KinesisTransport | None = None,
    ) -> None:
        if config is None:
            config = Config(
                app=_APP,
                dynamodb_table=_NO_TABLE,
                region=region,
                kinesis_region=kinesis_region,
                kinesis_endpoint=kinesis_endpoint,
                sts_endpoint=sts_endpoint,
                role_arn=role_arn,
                external_id=external_id,
                accounts=accounts,
                kinesis_endpoints=kinesis_endpoints,
            )
        self.options = ProducerOptions(
            linger=linger,
            max_buffered_records=max_buffered_records,
            max_buffered_bytes=max_buffered_bytes,
            block=block,
            delivery_timeout=delivery_timeout,
            ordering=ordering,
            aggregate=aggregate,
            max_in_flight=max_in_flight,
            shard_records_per_second=shard_records_per_second,
            shard_bytes_per_second=shard_bytes_per_second,
            retry_backoff=retry_backoff,
            max_retry_backoff=max_retry_backoff,
        )
        self.config = config
        self._topics: dict[str, Topic[Any] | None] | None = None
        if topics is not None:
            self._topics = TopicList(topics, type(self).__name__).by_stream
            tables = sorted(name for name in self._topics if is_dynamodb_stream(name))
            if tables:
                raise ConfigError(
                    "topics", f"{tables[0]!r}: {TABLE_STREAM_WRITES}", type(self).__name__
                )
        kinesis = given_transport(kinesis, type(self).__name__)
        self._core = ProducerCore(
            self.options, config, metrics_for(config, "producer"), kinesis=kinesis
        )

    @classmethod
    def from_config(cls, config: Config, **options: Any) -> Any:
        """A producer reaching AWS as ``config`` says (region, endpoints, role); ``options`` are
        the producer's own keywords. ``config.metrics`` turns on its Prometheus counters."""
        return cls(config=config, **options)

    @classmethod
    def check_options(cls, **options: Any) -> None:
        """Raise ConfigError for what the constructor would refuse, without starting anything
        (the Spark sink checks its options on the driver this way)."""
        BaseProducer(**options)

    def stats(self) -> ProducerStats:
        """Counters since creation and what is buffered now (see :class:`ProducerStats`)."""
        return self._core.stats()

    @property
    def topics(self) -> frozenset[str] | None:
        """The streams this producer may put to (its ``topics=``), or None: any stream."""
        return None if self._topics is None else frozenset(self._topics)

    def _record(
        self,
        stream: str | Topic[Any],
        data: Any,
        partition_key: str,
        explicit_hash_key: str | None,
        future: Any,
    ) -> PendingRecord:
        """The checked record for ``put``: a named error (InvalidRecordError and kin) for what
        Kinesis would refuse."""
        if isinstance(stream, Topic):
            name = _stream_name(stream.stream)
            listed = self._topics.get(name) if self._topics is not None else None
            if listed is not None and listed is not stream and listed != stream:
                raise InvalidRecordError(
                    f"put(stream): {stream!r} is not this producer's topic {listed!r}: put "
                    "to the listed topic"
                )
            data = stream.encode(data)
        else:
            name = (
                stream if type(stream) is str and stream in _CHECKED_NAMES else _stream_name(stream)
            )
            topic = self._topics.get(name) if self._topics is not None else None
            if topic is not None:
                data = topic.encode(data)
        if self._topics is not None and name not in self._topics:
            raise InvalidRecordError(
                f"put(stream): {outside_topics([name], self._topics, 'producer')}"
            )
        payload = check_record(data, partition_key, explicit_hash_key)
        return PendingRecord(name, payload, partition_key, explicit_hash_key, future)


#: Stream names that passed :func:`_stream_name` (a put's name is usually one of a few: the
#: check is a lookup); bounded, so that a process putting to ever new streams does not grow it.
_CHECKED_NAMES: set[object] = set()
_CHECKED_NAMES_MAX = 1024


def _stream_name(stream: object) -> str:
    if isinstance(stream, str) and stream.startswith("arn:"):
        return check_stream_arn(stream)  # a table's stream: ReadOnlyStreamError, by name
    if not is_kinesis_name(stream):
        raise InvalidRecordError(
            f"put(stream): a stream name is 1-128 of [A-Za-z0-9_.-], got {stream!r}"
        )
    if len(_CHECKED_NAMES) < _CHECKED_NAMES_MAX and type(stream) is str:
        _CHECKED_NAMES.add(stream)
    return stream
