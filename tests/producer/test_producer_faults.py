"""The producer under partial failures, through the fault proxy (``Fault.refuse_entries``):
only refused entries are sent again, every record lands once, and with ``ordering="key"`` each
partition key's records land in put order; a record refused past ``delivery_timeout`` fails
with a named error and is counted, never dropped silently."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from support.faultproxy import Fault, FaultProxy
from support.group import create_stream, kinesis
from support.produced import by_key, read_all
from support.standins import NodeStandIn
from support.wait import wait_until

from kinesumer import Config, Producer
from kinesumer.errors import DeliveryTimeoutError, FlushError

RECORDS = 3000
KEYS = 40


def put_numbered(producer: Producer, stream: str) -> None:
    for i in range(RECORDS):
        producer.put(stream, b"%d" % i, partition_key=f"key-{i % KEYS}")
    producer.flush()


def out_of_order(url: str, stream: str) -> tuple[list[int], int]:
    """Every number read back (sorted) and how many records came after a later one of their
    key."""
    records = read_all(url, stream)
    broken = 0
    for datas in by_key(records).values():
        numbers = [int(d) for d in datas]
        broken += sum(1 for a, b in itertools.pairwise(numbers) if b < a)
    return sorted(int(r.data) for r in records), broken


@pytest.mark.parametrize("aggregate", [False, True], ids=["plain", "aggregated"])
def test_refused_entries_are_retried_and_each_key_keeps_put_order(
    kinesalite: NodeStandIn,
    unique_name: Callable[[str], str],
    fault_proxy: Callable[[str], FaultProxy],
    aggregate: bool,
) -> None:
    stream = unique_name("pf")
    create_stream(kinesalite.url, stream, 2)
    proxy = fault_proxy(kinesalite.url)
    proxy.add_rule(Fault.refuse_entries(0.2), service="kinesis", operation="PutRecords", seed=7)
    with Producer(
        kinesis_endpoint=proxy.url, region="us-east-1", ordering="key", aggregate=aggregate
    ) as producer:
        put_numbered(producer, stream)
        stats = producer.stats()
    numbers, broken = out_of_order(kinesalite.url, stream)
    assert numbers == list(range(RECORDS))  # every record once
    assert broken == 0
    assert stats.retries > 0 and stats.throttled_entries > 0
    assert stats.records_put == RECORDS and stats.records_failed == 0


def test_without_the_key_rule_the_same_faults_break_order(
    kinesalite: NodeStandIn,
    unique_name: Callable[[str], str],
    fault_proxy: Callable[[str], FaultProxy],
) -> None:
    """The control: what the check above catches (the usual retry loop's fault)."""
    stream = unique_name("pf")
    create_stream(kinesalite.url, stream, 2)
    proxy = fault_proxy(kinesalite.url)
    proxy.add_rule(Fault.refuse_entries(0.2), service="kinesis", operation="PutRecords", seed=7)
    with Producer(kinesis_endpoint=proxy.url, region="us-east-1", ordering="none") as producer:
        put_numbered(producer, stream)
    numbers, broken = out_of_order(kinesalite.url, stream)
    assert numbers == list(range(RECORDS))
    assert broken > 0


def test_a_record_refused_past_the_delivery_timeout_fails_and_is_counted(
    kinesalite: NodeStandIn,
    unique_name: Callable[[str], str],
    fault_proxy: Callable[[str], FaultProxy],
) -> None:
    stream = unique_name("pf")
    create_stream(kinesalite.url, stream, 1)
    proxy = fault_proxy(kinesalite.url)
    rule = proxy.add_rule(Fault.refuse_entries(1.0), service="kinesis", operation="PutRecords")
    producer = Producer(kinesis_endpoint=proxy.url, region="us-east-1", delivery_timeout=1.0)
    futures = [producer.put(stream, b"%d" % i, partition_key="k") for i in range(3)]
    with pytest.raises(FlushError) as raised:
        producer.flush()
    assert raised.value.failures == {"DeliveryTimeoutError": 3}
    for future in futures:
        with pytest.raises(DeliveryTimeoutError, match=r"delivery_timeout=1\.0"):
            future.result()
    rule.remove()
    producer.put(stream, b"after", partition_key="k")
    producer.close()
    stats = producer.stats()
    assert stats.failures == {"DeliveryTimeoutError": 3} and stats.records_put == 1
    assert [r.data for r in read_all(kinesalite.url, stream)] == [b"after"]


def test_whole_call_throttling_and_server_errors_are_retried(
    kinesalite: NodeStandIn,
    unique_name: Callable[[str], str],
    fault_proxy: Callable[[str], FaultProxy],
) -> None:
    stream = unique_name("pf")
    create_stream(kinesalite.url, stream, 1)
    proxy = fault_proxy(kinesalite.url)
    proxy.add_rule(Fault.throttle(), service="kinesis", operation="PutRecords", count=2)
    proxy.add_rule(Fault.http_500(), service="kinesis", operation="PutRecords", count=1)
    with Producer(kinesis_endpoint=proxy.url, region="us-east-1") as producer:
        futures = [producer.put(stream, b"%d" % i, partition_key=f"k{i}") for i in range(20)]
        producer.flush()
    assert all(f.result().sequence_number for f in futures)
    assert sorted(int(r.data) for r in read_all(kinesalite.url, stream)) == list(range(20))


def test_stats_and_prometheus_counters_tell_what_happened(
    kinesalite: NodeStandIn,
    unique_name: Callable[[str], str],
    fault_proxy: Callable[[str], FaultProxy],
) -> None:
    from prometheus_client import REGISTRY

    stream = unique_name("pm")
    create_stream(kinesalite.url, stream, 1)
    proxy = fault_proxy(kinesalite.url)
    proxy.add_rule(Fault.refuse_entries(0.3), service="kinesis", operation="PutRecords", seed=3)
    config = Config(
        app="producer-metrics",
        dynamodb_table="unused",
        region="us-east-1",
        kinesis_endpoint=proxy.url,
        metrics=True,
    )
    with Producer.from_config(config) as producer:
        for i in range(200):
            producer.put(stream, b"%d" % i, partition_key=f"k{i}")
        producer.flush()
        stats = producer.stats()
    labels = {"app": "producer-metrics", "client_id": "producer", "stream": stream}
    sample = REGISTRY.get_sample_value
    assert sample("kinesumer_produced_records_total", labels) == 200 == stats.records_put
    assert sample("kinesumer_produced_bytes_total", labels) == stats.bytes_put
    retries = sample("kinesumer_produce_retries_total", labels)
    assert retries == stats.retries and retries is not None and retries > 0
    throttled = sample("kinesumer_produce_throttled_entries_total", labels)
    assert throttled == stats.throttled_entries == stats.retries
    assert stats.latency.count == 200 and stats.latency.p50 is not None
    assert stats.buffered_records == 0 and stats.calls > 1


def test_the_buffered_records_gauge_rises_while_calls_hang_and_flush_empties_it(
    kinesalite: NodeStandIn,
    unique_name: Callable[[str], str],
    fault_proxy: Callable[[str], FaultProxy],
) -> None:
    from prometheus_client import REGISTRY

    stream = unique_name("pb")
    create_stream(kinesalite.url, stream, 1)
    proxy = fault_proxy(kinesalite.url)
    held = proxy.add_rule(Fault.blackhole(), service="kinesis", operation="PutRecords")
    app = unique_name("buffered")
    config = Config(
        app=app,
        dynamodb_table="unused",
        region="us-east-1",
        kinesis_endpoint=proxy.url,
        metrics=True,
    )
    labels = {"app": app, "client_id": "producer"}

    def buffered(unit: str) -> float | None:
        return REGISTRY.get_sample_value(f"kinesumer_produce_buffered_{unit}", labels)

    with Producer.from_config(config) as producer:
        for i in range(50):
            producer.put(stream, b"%d" % i, partition_key=f"k{i}")
        wait_until(lambda: buffered("records") == 50, what="50 records reported buffered")
        assert buffered("bytes") == producer.stats().buffered_bytes > 0
        held.remove()  # the held calls are dropped unanswered: the producer sends them again
        producer.flush()
        assert buffered("records") == 0 and buffered("bytes") == 0
        assert producer.stats().records_put == 50


def test_a_stale_map_that_cannot_be_listed_again_keeps_writing(
    kinesalite: NodeStandIn,
    unique_name: Callable[[str], str],
    fault_proxy: Callable[[str], FaultProxy],
) -> None:
    """After a split, ListShards failing past its retries must not fail the records: Kinesis
    places each by its hash key whatever the producer's map says."""
    stream = unique_name("pf")
    create_stream(kinesalite.url, stream, 1)
    proxy = fault_proxy(kinesalite.url)
    client = kinesis(kinesalite.url)
    with Producer(kinesis_endpoint=proxy.url, region="us-east-1") as producer:
        producer.put(stream, b"before", partition_key="k").result(timeout=30)
        parent = client.list_shards(StreamName=stream)["Shards"][0]
        low, high = (int(parent["HashKeyRange"][k]) for k in ("StartingHashKey", "EndingHashKey"))
        client.split_shard(
            StreamName=stream,
            ShardToSplit=parent["ShardId"],
            NewStartingHashKey=str((low + high) // 2),
        )
        client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.1})
        rule = proxy.add_rule(Fault.throttle(), service="kinesis", operation="ListShards", count=6)
        for i in range(30):  # lands on the children: the map is stale
            producer.put(stream, b"%d" % i, partition_key=f"k{i}")
        producer.flush()
        # The map is listed again beside the writes; put once that listing failed past its
        # retries.
        wait_until(lambda: rule.fired == 6, what="the listing refused past its retries")
        for i in range(30, 60):
            producer.put(stream, b"%d" % i, partition_key=f"k{i}")
        producer.flush()
    assert len(read_all(kinesalite.url, stream)) == 61
