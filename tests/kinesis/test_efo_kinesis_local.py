"""Enhanced fan-out end to end on kinesis-local + dynalite: the real transport (HTTP/2
SubscribeToShard, botocore's signer and event-stream parser), real registration.

kinesis-local pushes at most one event a second per shard and answers a second subscription to
a shard with ResourceInUse (AWS would take over after 5 s): a takeover after a kill -9 shows the
retry path. Member processes (``tests/support/member.py --efo``) die by SIGKILL like real ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from support.group import Member, create_stream, datas, duplicates, make_config, put, setup_table
from support.scenario import MemberProcess, member_command
from support.standins import start_kinesis_local
from support.wait import eventually, wait_until

from kinesumer import Record
from kinesumer.cli import main as cli_main

Names = Callable[[str], str]

# Multi-process and CPU-bound (kinesis-local pushes every event through Scala.js on node): run
# first, before a full run's other files load the machine (tests/conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.first]


@pytest.fixture(scope="module")
def kinesis_local() -> Iterator[Any]:
    server = start_kinesis_local()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def env(kinesis_local: Any, dynalite: Any, unique_name: Names) -> dict[str, Any]:
    config = make_config(
        kinesis_local.url,
        dynalite.url,
        unique_name("app"),
        unique_name("state"),
        enhanced_fan_out=True,
    )
    setup_table(config)
    return {"url": kinesis_local.url, "config": config, "stream": unique_name("s")}


def consumers_of(url: str, stream: str) -> list[str]:
    client = boto3.client("kinesis", endpoint_url=url, region_name="us-east-1")
    arn = client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
    listed = client.list_stream_consumers(StreamARN=arn)["Consumers"]
    return [c["ConsumerName"] for c in listed if c["ConsumerStatus"] != "DELETING"]


async def test_group_every_record_once_with_handoff_then_deregister(
    env: dict[str, Any],
) -> None:
    url, stream, config = env["url"], env["stream"], env["config"]
    create_stream(url, stream, 4)
    sink: list[tuple[str, Record]] = []
    first = Member(config.replace(client_id="a"), [stream], sink).start()
    second = Member(config.replace(client_id="b"), [stream], sink).start()
    produced = put(url, stream, 0, 200)
    # 120 s: generous for a loaded machine. The file has its own kinesis-local server (the
    # module fixture above), so earlier tests leave nothing on it; the whole test takes about
    # 7 s alone and after the files before it in the suite, 13 s beside two CPU-bound processes.
    await eventually(lambda: len(sink) >= 200, what="every record", timeout=120)
    await second.close()  # graceful: its shards move to the first member at their checkpoints
    produced += put(url, stream, 200, 100)
    await eventually(lambda: len(set(datas(sink))) >= 300, what="after the handoff", timeout=120)
    await first.close()
    assert first.error is None and second.error is None
    assert sorted(datas(sink)) == sorted(produced)
    assert duplicates(sink) == {}
    # Both members registered the same consumer (racing), and closing deregistered nothing.
    assert consumers_of(url, stream) == [config.app]
    code = await asyncio.to_thread(
        cli_main,
        [
            "deregister-consumer",
            "--app",
            config.app,
            "--table",
            config.dynamodb_table,
            "--region",
            "us-east-1",
            "--kinesis-endpoint",
            url,
            "--dynamodb-endpoint",
            str(config.dynamodb_endpoint),
            "--stream",
            stream,
        ],
    )
    assert code == 0
    wait_until(lambda: consumers_of(url, stream) == [], what="the consumer deregistered")


def test_sigkilled_member_is_taken_over(env: dict[str, Any], dynalite: Any, tmp_path: Path) -> None:
    url, stream, config = env["url"], env["stream"], env["config"]
    create_stream(url, stream, 2)

    def start(client_id: str) -> MemberProcess:
        command = member_command(
            app=config.app,
            table=config.dynamodb_table,
            kinesis_url=url,
            dynamodb_url=dynalite.url,
            client_id=client_id,
            out=tmp_path / f"{client_id}.jsonl",
            streams=[stream],
            config={"heartbeat_interval": 0.25, "client_timeout": 2.0, "commit_interval": 0.5},
            extra=["--efo"],
        )
        return MemberProcess(client_id, command, tmp_path)

    victim, survivor = start("victim"), start("survivor")
    try:
        produced = {int(d) for d in put(url, stream, 0, 100)}
        wait_until(
            lambda: victim.owned() and survivor.owned(),
            what="both members own a shard",
            timeout=120,
        )
        wait_until(
            lambda: {d.number for m in (victim, survivor) for d in m.deliveries()} >= produced,
            what="the first records",
            timeout=120,
            diagnose=lambda: victim.describe() + survivor.describe(),
        )
        victim.kill()
        produced |= {int(d) for d in put(url, stream, 100, 100)}
        wait_until(
            lambda: {d.number for d in survivor.deliveries()} >= set(range(100, 200)),
            what="the survivor reads the victim's shard too",
            timeout=120,
            diagnose=survivor.describe,
        )
        assert len(survivor.owned()) == 2
        survivor.stop()
        assert survivor.returncode == 0, survivor.describe()
    finally:
        victim.stop()
        survivor.stop()
