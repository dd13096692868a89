"""Typed topics, both ways: ``Topic(stream, type)`` encodes with :mod:`kinesumer.codecs` at
``put`` and ``consumer.run(topic, handler)`` hands the handler the same type back; a producer
made with ``topics=[...]`` refuses other streams."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any, TypedDict

import msgspec
import pydantic
import pytest
from support.group import create_stream, make_config, setup_table
from support.produced import read_all
from support.standins import NodeStandIn

from kinesumer import AsyncKinesumer, Producer, Topic
from kinesumer.errors import ConfigError, InvalidRecordError


@dataclasses.dataclass
class Order:
    id: int
    item: str


class OrderStruct(msgspec.Struct):
    id: int
    item: str


class OrderDict(TypedDict):
    id: int
    item: str


class OrderModel(pydantic.BaseModel):
    id: int
    item: str


@pytest.mark.parametrize(
    ("payload", "value"),
    [
        (Order, Order(1, "tea")),
        (OrderStruct, OrderStruct(1, "tea")),
        (OrderDict, OrderDict(id=1, item="tea")),
        (OrderModel, OrderModel(id=1, item="tea")),
        ("json", {"id": 1, "item": "tea"}),
    ],
    ids=["dataclass", "struct", "typeddict", "pydantic", "json"],
)
def test_a_topic_encodes_what_its_type_decodes(payload: Any, value: Any) -> None:
    topic = Topic("orders", payload)
    data = topic.encode(value)
    assert msgspec.json.decode(data) == {"id": 1, "item": "tea"}
    assert topic.decode(data) == value


def test_topic_errors_are_named() -> None:
    with pytest.raises(ConfigError, match=r"Topic\(type\)"):
        Topic("orders", object())
    with pytest.raises(ConfigError, match=r"Topic\(stream\)"):
        Topic("bad name!", Order)
    with pytest.raises(InvalidRecordError, match="topic 'orders' carries Order, not object"):
        Topic("orders", Order).encode(object())  # type: ignore[arg-type]
    with pytest.raises(InvalidRecordError, match="does not encode for topic 'any'"):
        Topic("any", "json").encode(object())


def test_typed_topics_both_ways_and_topics_only(
    kinesalite: NodeStandIn, dynalite: NodeStandIn, unique_name: Callable[[str], str]
) -> None:
    stream = unique_name("orders")
    create_stream(kinesalite.url, stream, 2)
    orders = Topic(stream, Order)
    with Producer(kinesis_endpoint=kinesalite.url, region="us-east-1", topics=[orders]) as p:
        for i in range(20):
            p.put(orders, Order(i, f"item-{i}"), partition_key=f"o{i}")
        p.put(stream, Order(20, "by name"), partition_key="o20")  # a topic's stream encodes
        with pytest.raises(InvalidRecordError, match="not one of this producer's topics"):
            p.put(unique_name("other"), b"x", partition_key="k")
        with pytest.raises(InvalidRecordError, match="does not encode"):
            p.put(orders, {1, 2}, partition_key="k")
    assert len(read_all(kinesalite.url, stream)) == 21

    config = make_config(kinesalite.url, dynalite.url, unique_name("app"), unique_name("state"))
    setup_table(config)
    seen: list[Any] = []

    async def main() -> None:
        everything = asyncio.Event()
        async with AsyncKinesumer(config) as consumer:

            async def handle(message: Any) -> None:
                seen.append(message.value)
                if len(seen) == 21:
                    everything.set()

            running = asyncio.create_task(consumer.run(orders, handle))
            await everything.wait()
            await consumer.aclose()
            await running

    asyncio.run(asyncio.wait_for(main(), 120))
    assert all(isinstance(value, Order) for value in seen)
    assert sorted(value.id for value in seen) == list(range(21))


def test_a_producers_topics_are_the_consumers_list(kinesalite: NodeStandIn) -> None:
    """The producer's topics= is the consumer's TopicList: the list is checked when made (a
    bare string, a bad name, two types for one stream), and a Topic of another type for a
    listed stream is refused at put, as the consumer refuses it at run()."""
    reach = {"kinesis_endpoint": kinesalite.url, "region": "us-east-1"}
    with pytest.raises(ConfigError, match=r"^Producer\(topics\): must be a list"):
        Producer(**reach, topics="orders")
    with pytest.raises(ConfigError, match=r"^Producer\(topics\): 'bad name!' is not a Kinesis"):
        Producer(**reach, topics=["bad name!"])
    with pytest.raises(ConfigError, match="one stream, one payload type"):
        Producer(**reach, topics=[Topic("orders", Order), Topic("orders", OrderStruct)])
    with Producer(**reach, topics=[Topic("orders", Order), "payments"]) as producer:
        with pytest.raises(
            InvalidRecordError,
            match=r"^put\(stream\): Topic\('orders', OrderStruct\) is not this producer's topic "
            r"Topic\('orders', Order\)",
        ):
            producer.put(Topic("orders", OrderStruct), OrderStruct(1, "tea"), partition_key="k")
        with pytest.raises(
            InvalidRecordError,
            match=r"^put\(stream\): 'refunds' is not one of this producer's topics "
            r"\(orders, payments\); add it to topics=\[\.\.\.\]",
        ):
            producer.put("refunds", b"x", partition_key="k")
