"""``kinesumer lag --serve`` in pieces, with no AWS stand-in: the board (history, staleness), the
metrics as Prometheus parses them, the HTTP handler's answers and headers, and the probe loop
with a probe of the test's own (good, failing, hanging)."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.wait import wait_until

from kinesumer import cli
from kinesumer.cli.lag_board import MAX_HISTORY_POINTS, LagBoard, MemberRow, Snapshot
from kinesumer.cli.lag_metrics import lag_registry, render_metrics
from kinesumer.cli.lag_serve import LagServer, ProbeLoop
from kinesumer.core.lag import GroupLag, ShardLag

T0 = 1_700_000_000_000  # epoch ms


def figure(*lags: int, stream: str = "orders", owner: str | None = "m-1") -> GroupLag:
    rows = [
        ShardLag(stream, f"shardId-{i:012d}", owner, f"{100 + i}", lag)
        for i, lag in enumerate(lags)
    ]
    return GroupLag.of("app-1", "state-1", rows, [stream])


def snapshot(at_ms: int, *lags: int, members: tuple[MemberRow, ...] = ()) -> Snapshot:
    return Snapshot(figure(*lags), members, at_ms, 0.25)


def metrics_of(board: LagBoard, now_s: float) -> dict[str, list[Any]]:
    """Sample name -> its samples, as Prometheus's own text parser reads the page."""
    text = render_metrics(lag_registry(board, clock=lambda: now_s)).decode()
    samples: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


# -- the board ---------------------------------------------------------------------------------
def test_the_history_keeps_the_window_and_never_more_than_its_count() -> None:
    """Points older than the window before the newest leave; and a tiny interval does not
    make the history grow past :data:`MAX_HISTORY_POINTS`."""
    board = LagBoard("app-1", "state-1", interval=10, history_seconds=60)
    for i in range(20):  # one every 10 s: 200 s of probes
        board.succeeded(snapshot(T0 + i * 10_000, i * 100))
    history = board.status_document(T0 + 190_000)["history"]
    assert history["times"] == [T0 + i * 10_000 for i in range(13, 20)]  # the last 60 s
    (series,) = history["series"]
    assert series["millis_behind"] == [i * 100 for i in range(13, 20)]
    assert history["max_millis_behind"] == series["millis_behind"]

    fast = LagBoard("app-1", "state-1", interval=0.01, history_seconds=900)
    for i in range(MAX_HISTORY_POINTS + 500):
        fast.succeeded(snapshot(T0 + i * 10, 1))
    assert len(fast.status_document(T0)["history"]["times"]) == MAX_HISTORY_POINTS


def test_a_shard_missing_from_a_probe_is_a_gap_in_its_series() -> None:
    board = LagBoard("app-1", "state-1", interval=10)
    board.succeeded(snapshot(T0, 5, 7))
    board.succeeded(snapshot(T0 + 10_000, 9))  # shard 1 gone (aged out)
    series = board.status_document(T0 + 10_000)["history"]["series"]
    assert [s["millis_behind"] for s in series] == [[5, 9], [7, None]]


def test_a_failed_probe_keeps_the_last_good_figures_marked_stale() -> None:
    board = LagBoard("app-1", "state-1", interval=10)
    assert board.lag_document(T0) is None
    assert board.status_document(T0)["stale"] is True  # nothing measured yet
    board.succeeded(snapshot(T0, 1500, 300))
    good = board.lag_document(T0 + 1000)
    assert good is not None and good["stale"] is False
    assert (good["max_millis_behind"], good["max_seconds_behind"]) == (1500, 1.5)
    assert good["age_seconds"] == 1.0

    board.failed("StateTableNotFoundError: gone", T0 + 10_000)
    stale = board.lag_document(T0 + 10_000)
    assert stale is not None and stale["stale"] is True
    assert stale["max_millis_behind"] == 1500  # the last good figure, served on
    assert stale["probes"] == {
        "succeeded": 1,
        "failed": 1,
        "last_error": "StateTableNotFoundError: gone",
    }
    assert len(board.status_document(T0 + 10_000)["history"]["times"]) == 1  # no point added

    board.succeeded(snapshot(T0 + 20_000, 0, 0))
    fresh = board.lag_document(T0 + 20_000)
    assert fresh is not None and fresh["stale"] is False and fresh["max_millis_behind"] == 0


def test_figures_older_than_stale_after_are_stale_without_a_failure() -> None:
    """A probe hanging on a call posts nothing: the figure ages into staleness."""
    board = LagBoard("app-1", "state-1", interval=10, stale_after=30)
    board.succeeded(snapshot(T0, 100))
    assert board.reading(T0 + 30_000).stale is False
    assert board.reading(T0 + 30_001).stale is True


def test_the_lag_document_is_the_json_document_plus_the_scaler_fields() -> None:
    board = LagBoard("app-1", "state-1", interval=10)
    board.succeeded(snapshot(T0, 2500, 0))
    document = board.lag_document(T0)
    assert document is not None
    printed = figure(2500, 0).to_json()  # what `kinesumer lag --json` prints
    assert {k: document[k] for k in printed} == printed
    extra = set(document) - set(printed)
    assert extra == {"max_seconds_behind", "stale", "probed_at", "age_seconds", "probes"}


# -- the metrics -------------------------------------------------------------------------------
def test_metrics_parse_and_name_the_group_streams_shards_and_owners() -> None:
    board = LagBoard("app-1", "state-1", interval=10)
    samples = metrics_of(board, T0 / 1000)
    assert "kinesumer_group_lag_seconds" not in samples  # no figure: no data, not a 0
    assert samples["kinesumer_lag_stale"][0].value == 1
    members = (MemberRow("m-1", True, True), MemberRow("m-2", False, False))
    board.succeeded(snapshot(T0, 2500, 0, members=members))

    samples = metrics_of(board, T0 / 1000 + 1)
    (group,) = samples["kinesumer_group_lag_seconds"]
    assert (group.labels, group.value) == ({"app": "app-1"}, 2.5)
    (stream,) = samples["kinesumer_stream_lag_seconds"]
    assert (stream.labels["stream"], stream.value) == ("orders", 2.5)
    shards = {s.labels["shard_id"]: s.value for s in samples["kinesumer_shard_lag_seconds"]}
    assert shards == {"shardId-000000000000": 2.5, "shardId-000000000001": 0.0}
    owners = samples["kinesumer_shard_owner_info"]
    assert {(s.labels["shard_id"], s.labels["owner"], s.value) for s in owners} == {
        ("shardId-000000000000", "m-1", 1.0),
        ("shardId-000000000001", "m-1", 1.0),
    }
    assert samples["kinesumer_group_live_members"][0].value == 1
    assert samples["kinesumer_lag_stale"][0].value == 0
    assert samples["kinesumer_lag_probe_last_success_timestamp_seconds"][0].value == T0 / 1000
    assert samples["kinesumer_lag_probe_duration_seconds"][0].value == 0.25

    board.failed("boom", T0 + 10_000)
    samples = metrics_of(board, T0 / 1000 + 10)
    probes = {s.labels["result"]: s.value for s in samples["kinesumer_lag_probes_total"]}
    assert probes == {"ok": 1.0, "error": 1.0}
    assert samples["kinesumer_lag_stale"][0].value == 1
    assert samples["kinesumer_group_lag_seconds"][0].value == 2.5  # the last good one


def test_the_registry_is_its_own_not_the_process_wide_one() -> None:
    from prometheus_client import REGISTRY, generate_latest

    board = LagBoard("app-registry-check", "state-1", interval=10)
    board.succeeded(snapshot(T0, 1))
    lag_registry(board)
    assert b"app-registry-check" not in generate_latest(REGISTRY)


# -- the HTTP side -----------------------------------------------------------------------------
@pytest.fixture
def served() -> Iterator[tuple[LagServer, LagBoard]]:
    board = LagBoard("app-1", "state-1", interval=10)
    server = LagServer(("127.0.0.1", 0), board, lag_registry(board), clock=lambda: T0 / 1000)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, board
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def get(
    server: LagServer, path: str, host: str | None = None, method: str = "GET"
) -> tuple[int, dict[str, str], bytes]:
    port = server.server_address[1]
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        headers = {"Host": host} if host is not None else {}
        connection.request(method, path, headers=headers)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def test_every_path_answers_from_the_board(served: tuple[LagServer, LagBoard]) -> None:
    server, board = served
    code, headers, body = get(server, "/lag.json")
    assert code == 503  # a scaler must not read "no figure yet" as "no lag"
    assert json.loads(body)["stale"] is True
    board.succeeded(snapshot(T0, 1200, 0, members=(MemberRow("m-1", True, True),)))

    code, headers, body = get(server, "/lag.json")
    assert code == 200 and headers["Content-Type"] == "application/json"
    assert json.loads(body)["max_seconds_behind"] == 1.2
    code, headers, body = get(server, "/status.json?t=1")
    status = json.loads(body)
    assert code == 200 and status["members"][0]["client_id"] == "m-1"
    assert [s["millis_behind"] for s in status["shards"]] == [1200, 0]
    code, headers, body = get(server, "/metrics")
    assert code == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert b'kinesumer_group_lag_seconds{app="app-1"} 1.2' in body
    assert get(server, "/healthz")[0] == 200
    assert get(server, "/nothing-here")[0] == 404
    code, headers, body = get(server, "/metrics", method="HEAD")
    assert code == 200 and body == b"" and int(headers["Content-Length"]) > 0
    for path in ("/", "/lag.json", "/metrics", "/nothing-here"):
        _, headers, _ = get(server, path)
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["Cache-Control"] == "no-store"


def test_the_page_carries_a_strict_policy_with_a_new_nonce_each_time(
    served: tuple[LagServer, LagBoard],
) -> None:
    server, _ = served
    nonces = set()
    for _ in range(2):
        code, headers, body = get(server, "/")
        page = body.decode()
        assert code == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
        policy = headers["Content-Security-Policy"]
        (nonce,) = set(re.findall(r"'nonce-([^']+)'", policy))
        nonces.add(nonce)
        assert "default-src 'none'" in policy and "connect-src 'self'" in policy
        assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
        assert page.count(f'nonce="{nonce}"') == 2  # the style and the script, nothing else
        assert "{{NONCE}}" not in page
        assert not re.search(r"\b(src|href)=", page)  # no external asset
        assert "innerHTML" not in page and "insertAdjacentHTML" not in page
    assert len(nonces) == 2


def test_on_loopback_a_request_naming_another_host_is_refused(
    served: tuple[LagServer, LagBoard],
) -> None:
    """DNS rebinding: a page on another origin whose name resolves to 127.0.0.1."""
    server, _ = served
    port = server.server_address[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "localhost"):
        assert get(server, "/healthz", host=host)[0] == 200, host
    for host in (f"evil.example:{port}", "evil.example", f"10.0.0.1:{port}"):
        assert get(server, "/status.json", host=host)[0] == 421, host


def test_a_client_that_sends_nothing_is_dropped_after_the_request_timeout(
    served: tuple[LagServer, LagBoard], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread per connection: without a socket timeout, a client that connects and never
    finishes its request (or idles on a kept-alive connection) holds a thread for good, and
    enough of them (any pod in the cluster, where the example binds 0.0.0.0) leave the server
    unable to start another: no metrics, no scaling. The handler's timeout bounds each."""
    from kinesumer.cli.lag_serve import LagHandler

    assert LagHandler.timeout is not None and 0 < LagHandler.timeout <= 60
    monkeypatch.setattr(LagHandler, "timeout", 0.2)
    server, _ = served
    with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=10) as slow:
        slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finished
        assert slow.recv(1024) == b""  # closed by the server (bounded: 10 s, else an error)
    assert get(server, "/healthz")[0] == 200


# -- the probe loop ----------------------------------------------------------------------------
class ScriptedProbe:
    """Answers from ``script``: a Snapshot, an exception to raise, or "hang"."""

    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.calls = 0
        self.closed = False
        self.cancelled = threading.Event()

    async def __call__(self) -> Snapshot:
        step = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        if step == "hang":
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        if isinstance(step, BaseException):
            raise step
        assert isinstance(step, Snapshot)
        return step

    async def aclose(self) -> None:
        self.closed = True


def test_the_loop_posts_good_and_failed_probes_and_goes_on() -> None:
    board = LagBoard("app-1", "state-1", interval=0.01)
    probe = ScriptedProbe(
        [snapshot(T0, 700), RuntimeError("table\nunreachable"), snapshot(T0 + 20, 0)]
    )
    loop = ProbeLoop(board, probe, 0.01)
    loop.start()
    try:
        wait_until(lambda: board.reading(T0).successes >= 2, 30, "two good probes")
    finally:
        loop.stop()
    reading = board.reading(T0 + 20)
    assert reading.failures == 1
    assert reading.last is not None and reading.last.figure.max_millis_behind == 0
    assert reading.stale is False
    assert probe.closed


def test_stopping_the_loop_cancels_the_probe_in_flight() -> None:
    board = LagBoard("app-1", "state-1", interval=10)
    probe = ScriptedProbe(["hang"])
    loop = ProbeLoop(board, probe, 10)
    loop.start()
    wait_until(lambda: probe.calls == 1, 10, "the probe to start")
    loop.stop(timeout=10)
    assert probe.cancelled.is_set() and probe.closed
    reading = board.reading(T0)
    assert (reading.successes, reading.failures) == (0, 0)  # a cancelled probe is no failure


def test_serving_options_need_serve_and_json_is_not_served(
    capsys: pytest.CaptureFixture[str],
) -> None:
    where = ["--app", "a", "--table", "t", "--region", "us-east-1"]
    assert cli.main(["lag", *where, "--port", "9000"]) == 2
    assert "--port only with --serve" in capsys.readouterr().err
    assert cli.main(["lag", *where, "--serve", "--json"]) == 2
    assert "--serve serves /lag.json" in capsys.readouterr().err
