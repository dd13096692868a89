"""``aggregate=True``: KPL aggregates packed per shard, read back by a kinesumer group member
record by record (sub-sequence numbers), each key in put order, across a shard split that the
producer learns of only when Kinesis answers with another shard."""

from __future__ import annotations

from collections.abc import Callable

from support.group import create_stream, kinesis, make_config, setup_table
from support.produced import read_all
from support.standins import NodeStandIn

from kinesumer import Kinesumer, Producer, Record

KEYS = 30


def put_range(producer: Producer, stream: str, start: int, stop: int) -> None:
    for i in range(start, stop):
        producer.put(stream, b"%d" % i, partition_key=f"key-{i % KEYS}")
    producer.flush()


def test_aggregates_are_read_back_by_a_member_in_key_order_across_a_split(
    kinesalite: NodeStandIn, dynalite: NodeStandIn, unique_name: Callable[[str], str]
) -> None:
    stream = unique_name("pa")
    create_stream(kinesalite.url, stream, 1)
    client = kinesis(kinesalite.url)
    with Producer(kinesis_endpoint=kinesalite.url, region="us-east-1", aggregate=True) as producer:
        put_range(producer, stream, 0, 1500)
        parent = client.list_shards(StreamName=stream)["Shards"][0]
        low, high = (int(parent["HashKeyRange"][k]) for k in ("StartingHashKey", "EndingHashKey"))
        client.split_shard(
            StreamName=stream,
            ShardToSplit=parent["ShardId"],
            NewStartingHashKey=str((low + high) // 2),
        )
        client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.1})
        put_range(producer, stream, 1500, 2000)  # lands on one child: the map is stale
        put_range(producer, stream, 2000, 3000)  # the map listed again
        stats = producer.stats()
    raw = read_all(kinesalite.url, stream)
    assert len(raw) == 3000
    assert stats.calls < 3000 / 20  # packed: far fewer calls than records

    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    delivered: list[Record] = []
    with Kinesumer(config) as consumer:
        for record in consumer.consume([stream]):
            delivered.append(record)
            if len(delivered) == 3000:
                break
    assert sorted(int(r.data) for r in delivered) == list(range(3000))
    assert any(r.sub_sequence_number > 0 for r in delivered)
    # Written to the parent, then to the children (keys that an aggregate sent to a sibling
    # of their own child stay there: see StreamWriter._pin).
    assert parent["ShardId"] in {r.shard_id for r in delivered}
    assert len({r.shard_id for r in delivered}) >= 2
    # No key on two siblings (between which no reader keeps order): after the parent, each
    # key's records are on one child.
    children: dict[str, set[str]] = {}
    for record in delivered:
        if record.shard_id != parent["ShardId"]:
            children.setdefault(record.partition_key, set()).add(record.shard_id)
    assert all(len(shards) == 1 for shards in children.values()), children
    per_key: dict[str, list[int]] = {}
    for record in delivered:
        per_key.setdefault(record.partition_key, []).append(int(record.data))
    for key, numbers in per_key.items():
        assert numbers == sorted(numbers), key
