"""The status page of ``kinesumer lag --serve`` in a real headless browser (Debian's chromium,
:mod:`support.browser`), on kinesalite and dynalite with real member processes.

The assertions read what the page's own script put in the DOM (table cells, the chart's
``data-values``), never pixels. Every wait is bounded and polls a state: the server's
documents, or a fresh browser's DOM until it shows what the server already holds.
"""

from __future__ import annotations

import asyncio
import os
import signal
import struct
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from support.browser import Node, chromium, look_until, screenshot
from support.cli import Running
from support.group import create_stream, kinesis, make_config, put, setup_table
from support.lag_service import LagService, checkpoint, heartbeat_ahead
from support.standins import NodeStandIn
from support.wait import wait_until

Names = Callable[[str], str]

HOSTILE = "<img src=x onerror=alert(1)>"

#: The README's picture of the page, taken by the chart's test below when
#: ``KINESUMER_UPDATE_SCREENSHOT=1``; otherwise the test takes it into its tmp_path, so a plain
#: run never rewrites a tracked file.
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "img" / "lag-page.png"
SCREENSHOT_SIZE = (1200, 800)


def screenshot_path(tmp_path: Path) -> Path:
    if os.environ.get("KINESUMER_UPDATE_SCREENSHOT") == "1":
        return SCREENSHOT
    return tmp_path / SCREENSHOT.name


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    head = path.read_bytes()[:24]
    assert head[12:16] == b"IHDR", head
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def rendered(dom: Node) -> bool:
    body = dom.find_all("body")[0]
    return int(body.attrs.get("data-rendered", "0")) >= 1


def cells(dom: Node, table: str) -> list[list[str]]:
    body = dom.by_id(table).find_all("tbody")[0]
    return [[td.text for td in tr.find_all("td")] for tr in body.find_all("tr")]


def series(dom: Node) -> dict[str, list[int | None]]:
    """The chart's lines: shard id (or "group") -> the values it drew."""
    lines = {}
    for line in dom.by_id("chart").find_all("polyline"):
        key = line.attrs.get("data-shard-id", line.attrs["data-series"])
        lines[key] = [int(v) if v else None for v in line.attrs["data-values"].split(",")]
    return lines


def rose_then_fell(values: list[int | None]) -> bool:
    """0, then figures above 0 that never fall and end higher than they began, then 0 again.
    Not strictly rising: the lag is measured on Kinesis's clock, whose Date header counts whole
    seconds, so two probes less than a second apart (a busy machine delays one) can read one
    figure twice."""
    seen = [v for v in values if v is not None]
    for start, value in enumerate(seen):
        if value != 0:
            continue
        end = start + 1
        while (
            end < len(seen) and seen[end] > 0 and (end == start + 1 or seen[end] >= seen[end - 1])
        ):
            end += 1
        rise = seen[start + 1 : end]
        if len(rise) >= 2 and rise[-1] > rise[0] and 0 in seen[end:]:
            return True
    return False


def where_of(kinesis_url: str, dynamodb_url: str, app: str, table: str) -> list[str]:
    return [
        *("--app", app, "--table", table, "--region", "us-east-1"),
        *("--dynamodb-endpoint", dynamodb_url, "--kinesis-endpoint", kinesis_url),
    ]


def test_the_page_shows_names_from_the_table_as_text_and_runs_nothing(
    kinesalite: NodeStandIn, dynalite: NodeStandIn, unique_name: Names
) -> None:
    """A member whose client id is markup owns a shard of a stream whose name uses every kind
    of character Kinesis allows: the page shows both as text, in the members and the shards
    tables, and no element of theirs exists (an injected ``<img>`` would be one, even with its
    handler blocked by the page's policy)."""
    chromium()
    app, table = unique_name("app"), unique_name("state")
    stream = unique_name("odd") + "._-Az9"
    config = make_config(kinesalite.url, dynalite.url, app, table)
    setup_table(config)
    create_stream(kinesalite.url, stream, 1)
    put(kinesalite.url, stream, 0, 3)
    client = kinesis(kinesalite.url)
    (shard,) = [s["ShardId"] for s in client.list_shards(StreamName=stream)["Shards"]]
    iterator = client.get_shard_iterator(
        StreamName=stream, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    first = client.get_records(ShardIterator=iterator)["Records"][0]["SequenceNumber"]
    asyncio.run(checkpoint(config, stream, shard, first, owner=HOSTILE))
    asyncio.run(heartbeat_ahead(config, HOSTILE, frozenset({stream})))

    service = LagService(where_of(kinesalite.url, dynalite.url, app, table), "--interval", "1")
    try:
        wait_until(lambda: service.get("/lag.json")[0] == 200, 60, "a first good probe")
        dom = look_until(
            service.url + "/",
            lambda d: rendered(d) and bool(cells(d, "shards")),
            60,
            "the page's tables",
        )
    finally:
        assert service.stop(signal.SIGINT) == 0, service.proc.errors

    members = cells(dom, "members")
    assert members[0][:3] == [HOSTILE, "live", "leader"]
    assert members[0][6] == f"{stream}/{shard}"
    ((shown_stream, shown_shard, owner, position, _),) = cells(dom, "shards")
    assert (shown_stream, shown_shard, owner, position) == (stream, shard, HOSTILE, first)
    assert dom.by_id("app").text == app
    assert not dom.find_all("img")
    assert len(dom.find_all("script")) == 1  # the page's own
    (line,) = [n for n in dom.by_id("chart").find_all("polyline") if "data-shard-id" in n.attrs]
    assert (line.attrs["data-stream"], line.attrs["data-shard-id"]) == (stream, shard)


@pytest.mark.slow
def test_the_chart_rises_while_nobody_reads_and_falls_when_a_member_drains(
    kinesalite: NodeStandIn, dynalite: NodeStandIn, unique_name: Names, tmp_path: Path
) -> None:
    """A member reads the stream (lag 0) and stops; records arrive with nobody reading (each
    probe finds them older: the line rises); a second member drains them (it falls to 0). The
    members table shows who is live at each look. Then, with member-b running, a screenshot of
    the page (the README's, with ``KINESUMER_UPDATE_SCREENSHOT=1``). Its length (about 20 s) is
    the lag's own: probes a second apart on Kinesis's whole-second clock, enough of them for the
    line to rise while nobody reads and fall while a member drains."""
    chromium()
    app, table, stream = unique_name("app"), unique_name("state"), unique_name("chart")
    config = make_config(kinesalite.url, dynalite.url, app, table)
    setup_table(config)
    create_stream(kinesalite.url, stream, 2)
    put(kinesalite.url, stream, 0, 10)
    where = where_of(kinesalite.url, dynalite.url, app, table)
    service = LagService(where, "--stream", stream, "--interval", "1")
    members: list[Running] = []

    def member(client_id: str) -> Running:
        argv = [sys.executable, "-m", "kinesumer.cli", "consume", stream, *where]
        argv += ["--initial-position", "TRIM_HORIZON", "--client-id", client_id]
        members.append(Running(argv))
        return members[-1]

    def caught_up() -> bool:
        lag = service.json("/lag.json")
        return lag.get("_status") is None and lag["max_millis_behind"] == 0 and lag["shards"]

    def group_values() -> list[int | None]:
        values: list[int | None] = service.json("/status.json")["history"]["max_millis_behind"]
        return values

    try:
        first = member("member-a")
        first.wait_for(lambda: len(first.lines) >= 10, 60, "member-a's ten records")
        wait_until(caught_up, 60, "member-a's checkpoints")
        dom = look_until(
            service.url + "/",
            lambda d: rendered(d) and any(row[0] == "member-a" for row in cells(d, "members")),
            60,
            "member-a on the page",
        )
        assert [row[:3] for row in cells(dom, "members")] == [["member-a", "live", "leader"]]

        first.send_signal(signal.SIGTERM)  # graceful: checkpoints written, item deleted
        assert first.wait(60) == 0, first.errors
        put(kinesalite.url, stream, 10, 20)  # nobody reads them

        def rising() -> bool:
            values = [v for v in group_values() if v is not None]
            tail = values[-3:]
            return len(tail) == 3 and 0 < tail[0] < tail[1] < tail[2]

        wait_until(rising, 60, "the lag to rise over three probes")

        second = member("member-b")
        wait_until(caught_up, 90, "member-b to drain the records")
        wait_until(lambda: rose_then_fell(group_values()), 30, "the history to rise and fall")
        dom = look_until(
            service.url + "/",
            lambda d: rendered(d) and rose_then_fell(series(d).get("group", [])),
            60,
            "the chart to rise and fall",
        )
        picture = screenshot(service.url + "/", screenshot_path(tmp_path), SCREENSHOT_SIZE)
        second.send_signal(signal.SIGTERM)
        assert second.wait(60) == 0, second.errors
    finally:
        for process in members:
            process.stop()
        code = service.stop(signal.SIGINT)
    assert code == 0, service.proc.errors

    lines = series(dom)
    shards = {k: v for k, v in lines.items() if k != "group"}
    assert len(shards) == 2
    assert any(rose_then_fell(values) for values in shards.values()), lines
    for values in shards.values():  # every shard ends drained
        assert [v for v in values if v is not None][-1] == 0
    assert [row[:3] for row in cells(dom, "members")] == [["member-b", "live", "leader"]]
    assert {row[2] for row in cells(dom, "shards")} == {"member-b"}
    assert [row[4] for row in cells(dom, "shards")] == ["0 ms", "0 ms"]
    assert png_size(picture) == SCREENSHOT_SIZE
    assert picture.stat().st_size > 10_000  # a page drawn, not a blank window
