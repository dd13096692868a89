"""``kinesumer demo``: the README's promise, shown live on one machine with no AWS account.

It starts moto on 127.0.0.1, a stream and the state table, a producer of numbered records (data
``b"<n>"``) and N member processes: each one is ``kinesumer consume`` itself, so what the demo
shows is exactly what the command does. Each member's JSON lines come back over a pipe, which is
how the demo counts what every member consumed. Then it SIGKILLs one member (no handoff, no final
checkpoint), shows the others take its shards over once it stops heartbeating, starts another
member, shows the graceful rebalance, stops everyone gracefully and checks: nothing lost, and
duplicates only among what the killed member delivered but had not checkpointed yet.

Children run in their own session (Ctrl-C in the terminal reaches only the demo) and are stopped
by their own pid whatever happens; they also stop when their stdin closes, so even a demo that
is itself SIGKILLed leaves no member behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import boto3

from ..admin import create_state_table
from ..aws import RetryStats, boto_config, session_for
from ..config import Config
from ..core import assign
from ..errors import TransientAWSError
from ..statestore.dynamodb.store import DynamoDBStateStore
from . import status as view
from .status import CliError

APP = "demo"
TABLE = "kinesumer-demo"
STREAM = "demo-orders"
REGION = "us-east-1"
REFRESH = 0.5  # seconds between screen refreshes (and state table reads)
PHASE_TIMEOUT = 60.0  # a step that takes longer than this is reported as a failure
CLIENT_TIMEOUT = 3.0  # the members run with Config's defaults


def run_demo(*, members: int, shards: int, records: int, rate: float) -> int:
    _local_only_environment()
    # moto answers 500 to the rare request racing another in its threads (the library retries);
    # its werkzeug logger would print every request otherwise.
    logging.getLogger("werkzeug").setLevel(logging.CRITICAL)
    try:
        from moto.server import ThreadedMotoServer  # not a dependency of the library itself
    except ImportError:
        raise CliError(
            "the demo needs moto's server: pip install 'moto[server]>=5.1' "
            "(it comes with kinesumer[test])"
        ) from None

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        return Demo(f"http://{host}:{port}", members, shards, records, rate).run()
    finally:
        server.stop()


def _local_only_environment() -> None:
    """Fake credentials for this process and its members: the demo must never reach a real
    account, whatever profile, role or endpoint the shell has configured."""
    for name in list(os.environ):
        if name.startswith(("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL", "AWS_ROLE")):
            del os.environ[name]
    os.environ.pop("AWS_SESSION_TOKEN", None)
    os.environ.pop("AWS_WEB_IDENTITY_TOKEN_FILE", None)
    os.environ.update(
        AWS_ACCESS_KEY_ID="demo",
        AWS_SECRET_ACCESS_KEY="demo",
        AWS_EC2_METADATA_DISABLED="true",
    )


class _Abort(Exception):
    """A step did not happen in time; go straight to stopping and the summary."""


@dataclass
class Member:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    started: float
    reader: threading.Thread | None = None
    state: str = "running"  # running, killed, stopped, or "exited <code>"


@dataclass
class Deliveries:
    """What the members printed, by record number; filled by one reader thread per member."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    by_number: dict[int, list[str]] = field(default_factory=dict)
    by_member: dict[str, int] = field(default_factory=dict)
    total: int = 0

    def add(self, member: str, number: int) -> None:
        with self.lock:
            self.by_number.setdefault(number, []).append(member)
            self.by_member[member] = self.by_member.get(member, 0) + 1
            self.total += 1

    def read(self, member: str, stream: IO[bytes]) -> None:
        for line in stream:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                self.add(member, int(json.loads(line)["data"]))


class Producer(threading.Thread):
    """Puts records 0..total-1 at ``rate`` per second, never past what the demo allowed so far
    (the demo lets it go on a third at a time, so that every step has records to show)."""

    def __init__(self, url: str, total: int, rate: float) -> None:
        super().__init__(name="kinesumer-demo-producer", daemon=True)
        self._client: Any = boto3.client("kinesis", endpoint_url=url, region_name=REGION)
        self.total, self.rate = total, rate
        self.produced = 0
        self.error: BaseException | None = None
        self._allowed = 0
        self._cond = threading.Condition()
        self._stopped = threading.Event()

    def allow(self, count: int) -> None:
        with self._cond:
            self._allowed = min(self.total, max(self._allowed, count))
            self._cond.notify_all()

    def stop(self) -> None:
        self._stopped.set()
        with self._cond:
            self._cond.notify_all()

    def run(self) -> None:
        try:
            step = max(1, min(500, round(self.rate / 10)))
            next_at = time.monotonic()
            while self.produced < self.total and not self._stopped.is_set():
                with self._cond:
                    while self._allowed <= self.produced and not self._stopped.is_set():
                        self._cond.wait()
                        next_at = time.monotonic()
                    limit = self._allowed
                numbers = range(self.produced, min(self.produced + step, limit))
                if numbers and not self._stopped.is_set():
                    self._put(numbers)
                    self.produced = numbers.stop
                next_at += len(numbers) / self.rate
                self._stopped.wait(max(0.0, next_at - time.monotonic()))
        except Exception as exc:  # reported by the demo, which then fails
            self.error = exc

    def _put(self, numbers: range) -> None:
        pending = [{"Data": str(i).encode(), "PartitionKey": str(i)} for i in numbers]
        for attempt in range(20):
            response = self._client.put_records(StreamName=STREAM, Records=pending)
            pending = [
                entry
                for entry, result in zip(pending, response["Records"], strict=True)
                if "ErrorCode" in result
            ]
            if not pending:
                return
            time.sleep(0.05 * (attempt + 1))
        raise RuntimeError(f"put_records kept failing for {len(pending)} records")


class Demo:
    def __init__(self, url: str, members: int, shards: int, records: int, rate: float) -> None:
        self.url, self.size, self.shards, self.total, self.rate = (
            url,
            members,
            shards,
            records,
            rate,
        )
        self.out = sys.stdout
        self.tty = self.out.isatty()
        self.t0 = time.monotonic()
        self.deliveries = Deliveries()
        self.members: dict[str, Member] = {}
        self.events: list[str] = []
        self.failures: list[str] = []
        self.status: view.GroupStatus | None = None
        self.producer = Producer(url, records, rate)
        self.logdir = Path(tempfile.mkdtemp(prefix="kinesumer-demo-"))
        self.loop = asyncio.new_event_loop()
        self.stack = contextlib.AsyncExitStack()
        self.db: Any = None
        self.store: DynamoDBStateStore | None = None
        self.formed = False
        self.owners: dict[str, str] = {}
        self.leader: str | None = None
        self.victim: Member | None = None
        self.killed_at = 0.0
        self.takeover: float | None = None
        self.joined: tuple[str, float] | None = None

    # -- the script -------------------------------------------------------------------------
    def run(self) -> int:
        interrupted = False
        try:
            self._setup()
            self._script()
        except _Abort:
            pass
        except KeyboardInterrupt:
            interrupted = True
        finally:
            stopped = self._cleanup()
        if interrupted:
            pids = ", ".join(str(p) for p in stopped) or "none running"
            print(f"\ninterrupted: stopped the member processes ({pids})", file=self.out)
            return 130
        return self._summary()

    def _setup(self) -> None:
        self._print(
            f"kinesumer demo: moto on {self.url}, stream {STREAM} ({self.shards} shards), "
            f"{self.size} members, {self.total} records at {self.rate:g}/s"
        )
        kinesis: Any = boto3.client("kinesis", endpoint_url=self.url, region_name=REGION)
        kinesis.create_stream(StreamName=STREAM, ShardCount=self.shards)
        kinesis.get_waiter("stream_exists").wait(
            StreamName=STREAM, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100}
        )
        config = Config(app=APP, dynamodb_table=TABLE, region=REGION, dynamodb_endpoint=self.url)
        create_state_table(config)
        client = session_for(config).client(
            "dynamodb", region_name=REGION, endpoint_url=self.url, config=boto_config()
        )
        self.db = self.loop.run_until_complete(self.stack.enter_async_context(client))
        self.store = DynamoDBStateStore(self.db, TABLE, APP, RetryStats())
        if self.tty:
            self.out.write("\x1b[?25l\x1b[2J")  # hide the cursor, clear the screen

    def _script(self) -> None:
        for index in range(1, self.size + 1):
            self._start_member(f"member-{index}")
        self._wait("the group to form", lambda: self._settled(size=self.size))
        self.formed = True
        owners = ", ".join(f"{m.client_id}: {self._shards_of(m)}" for m in self._live_members())
        self._event(f"group formed ({owners}); producing")
        third = self.total // 3
        self.producer.allow(max(1, third))
        self.producer.start()
        pace = third / self.rate + PHASE_TIMEOUT
        self._wait("a third of the records", lambda: self.producer.produced >= third, pace)
        victim = self._pick_victim()
        self.producer.allow(2 * third)
        self._wait(f"the takeover of {victim.name}'s shards", lambda: self._settled(gone=victim))
        self.takeover = time.monotonic() - self.killed_at
        self._event(f"{victim.name}'s shards taken over {self.takeover:.1f}s after the kill")
        self._wait("two thirds of the records", lambda: self.producer.produced >= 2 * third, pace)
        newcomer = self._start_member(f"member-{self.size + 1}")
        self._wait(f"{newcomer.name} to get shards", lambda: self._settled(new=newcomer))
        self.joined = (newcomer.name, time.monotonic() - newcomer.started)
        self._event(f"{newcomer.name} got its shards {self.joined[1]:.1f}s after it started")
        self.producer.allow(self.total)
        self._wait(
            "every record to be consumed",
            lambda: self.producer.produced >= self.total and self._unique() >= self.total,
            timeout=self.total / self.rate + PHASE_TIMEOUT,
        )
        self._event("every record consumed; stopping the members gracefully")
        self._stop_members()
        self._refresh()  # the final checkpoints, every shard released

    def _wait(self, what: str, done: Callable[[], bool], timeout: float = PHASE_TIMEOUT) -> None:
        """Refresh the screen until ``done()``; a step that never happens fails the demo."""
        deadline = time.monotonic() + timeout
        while True:
            started = time.monotonic()
            self._refresh()
            if done():
                return
            if self.producer.error is not None:
                self._failure(f"the producer failed: {self.producer.error}")
                raise _Abort
            if started > deadline:
                self._failure(f"gave up waiting for {what} after {timeout:.0f}s")
                raise _Abort
            time.sleep(max(0.0, REFRESH - (time.monotonic() - started)))

    # -- members ----------------------------------------------------------------------------
    def _start_member(self, name: str) -> Member:
        command = [
            sys.executable, "-m", "kinesumer.cli", "consume", STREAM,
            "--app", APP, "--table", TABLE, "--region", REGION,
            "--kinesis-endpoint", self.url, "--dynamodb-endpoint", self.url,
            "--initial-position", "TRIM_HORIZON", "--client-id", name, "--stop-on-stdin-eof",
        ]  # fmt: skip
        log = self.logdir / f"{name}.log"
        with log.open("wb") as stderr:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                start_new_session=True,
            )
        member = Member(name, proc, log, time.monotonic())
        assert proc.stdout is not None
        member.reader = threading.Thread(
            target=self.deliveries.read, args=(name, proc.stdout), daemon=True
        )
        member.reader.start()
        self.members[name] = member
        self._event(f"started {name} (pid {proc.pid})")
        return member

    def _pick_victim(self) -> Member:
        """The live member owning the most shards (ties: the lowest id, the leader)."""
        live = [m for m in self._live_members() if self.members[m.client_id].state == "running"]
        chosen = min(live, key=lambda m: (-len(m.shards), m.client_id))
        victim = self.members[chosen.client_id]
        role = ", the leader" if chosen.leader else ""
        victim.proc.kill()  # SIGKILL, by its own pid: no handoff, no final checkpoint
        victim.proc.wait()
        victim.state = "killed"
        self.victim, self.killed_at = victim, time.monotonic()
        self._event(
            f"SIGKILL {victim.name} (pid {victim.proc.pid}{role}, shards {self._shards_of(chosen)}"
            f", {self.deliveries.by_member.get(victim.name, 0)} consumed): its shards wait "
            f"for its heartbeat to expire ({CLIENT_TIMEOUT:g}s)"
        )
        return victim

    def _stop_members(self) -> None:
        running = [m for m in self.members.values() if m.state == "running"]
        for member in running:
            member.proc.send_signal(signal.SIGTERM)
        for member in running:
            try:
                code = member.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                member.proc.kill()
                code = member.proc.wait()
                self._failure(f"{member.name} did not stop within 30s of SIGTERM; killed")
            member.state = "stopped" if code == 0 else f"exited {code}"
            if code != 0:
                self._failure(f"{member.name} exited with {code}: {self._log_tail(member)}")
            if member.reader is not None:
                member.reader.join(timeout=10)
        self._event(f"stopped {len(running)} members (SIGTERM: checkpoints written, left group)")

    def _cleanup(self) -> list[int]:
        """Stop whatever is still running, each child by its own pid; Ctrl-C cannot cut this
        short (signals are ignored meanwhile)."""
        previous = {}
        if threading.current_thread() is threading.main_thread():
            previous = {
                s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)
            }
        stopped = []
        try:
            self.producer.stop()
            for member in self.members.values():
                if member.proc.poll() is None:
                    member.proc.kill()
                    stopped.append(member.proc.pid)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    member.proc.wait(timeout=10)
                for pipe in (member.proc.stdin, member.proc.stdout):
                    if pipe is not None:
                        with contextlib.suppress(OSError):
                            pipe.close()
            if self.producer.is_alive():
                self.producer.join(timeout=10)
            with contextlib.suppress(Exception):
                self.loop.run_until_complete(self.stack.aclose())
            self.loop.close()
            if self.tty:
                self.out.write("\x1b[?25h")  # show the cursor again
                self.out.flush()
            if not self.failures:
                shutil.rmtree(self.logdir, ignore_errors=True)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return stopped

    def _log_tail(self, member: Member) -> str:
        with contextlib.suppress(OSError):
            lines = member.log.read_text(errors="replace").strip().splitlines()
            if lines:
                return lines[-1][-300:]
        return f"no output (log {member.log})"

    # -- state ------------------------------------------------------------------------------
    def _refresh(self) -> None:
        """Read the table, notice exits, ownership and leader changes, redraw."""
        assert self.store is not None
        with contextlib.suppress(TransientAWSError):
            self.status = self.loop.run_until_complete(
                view.collect(
                    self.db,
                    self.store,
                    app=APP,
                    table=TABLE,
                    client_timeout=CLIENT_TIMEOUT,
                    streams=[STREAM],
                )
            )
        for member in self.members.values():
            code = member.proc.poll()
            if member.state == "running" and code is not None:
                member.state = f"exited {code}"
                self._failure(f"{member.name} exited with {code}: {self._log_tail(member)}")
        if self.status is not None:
            self._notice_changes(self.status)
        if self.tty:
            self.out.write("\x1b[H" + "".join(f"{line}\x1b[K\n" for line in self._frame()))
            self.out.write("\x1b[J")
            self.out.flush()

    def _notice_changes(self, status: view.GroupStatus) -> None:
        for shard in status.streams.get(STREAM, ()):
            if shard.owner is None or not shard.owner_live:
                continue
            before = self.owners.get(shard.shard_id)
            self.owners[shard.shard_id] = shard.owner
            if self.formed and before is not None and before != shard.owner:
                how = "took it over from the killed member" if self._killed(before) else "handoff"
                self._event(f"shard {_short(shard.shard_id)}: {before} -> {shard.owner} ({how})")
        if status.leader is not None and status.leader != self.leader:
            if self.leader is not None:
                self._event(f"{status.leader} is now the leader")
            self.leader = status.leader

    def _killed(self, name: str) -> bool:
        member = self.members.get(name)
        return member is not None and member.state == "killed"

    def _settled(
        self, size: int | None = None, gone: Member | None = None, new: Member | None = None
    ) -> bool:
        """Every shard owned by the member the assignment gives it to (the library's own pure
        :func:`~kinesumer.core.assign` on the live members), and the membership as expected."""
        status = self.status
        if status is None:
            return False
        live = status.live_ids
        if (
            (size is not None and len(live) != size)
            or (gone is not None and gone.name in live)
            or (new is not None and new.name not in live)
        ):
            return False
        shards = {s.shard_id: s for s in status.streams.get(STREAM, ()) if not s.finished}
        if len(shards) < self.shards:
            return False
        expected = assign({m: {STREAM} for m in live}, {STREAM: sorted(shards)})
        return all(
            shards[shard_id].owner == member and shards[shard_id].owner_live
            for member, streams in expected.items()
            for shard_id in streams.get(STREAM, ())
        )

    def _live_members(self) -> list[view.MemberView]:
        return [m for m in self.status.members if m.live] if self.status else []

    def _unique(self) -> int:
        with self.deliveries.lock:
            return len(self.deliveries.by_number)

    # -- output -----------------------------------------------------------------------------
    def _frame(self, events: bool = True) -> list[str]:
        elapsed = time.monotonic() - self.t0
        d = self.deliveries
        unique = self._unique()
        lines = [
            f"kinesumer demo   {elapsed:5.1f}s   moto {self.url}   app {APP}   stream {STREAM}",
            "",
            f"produced  {self.producer.produced:>7} / {self.total} at {self.rate:g}/s",
            f"consumed  {unique:>7} unique, {d.total - unique} duplicate deliveries",
            "",
        ]
        table_members = {m.client_id: m for m in self.status.members} if self.status else {}
        rows = []
        for name, member in self.members.items():
            row = table_members.get(name)
            state = member.state
            if state == "running":
                state = "live" if row is not None and row.live else "joining"
            rows.append(
                [
                    name,
                    str(member.proc.pid),
                    state,
                    "*" if row is not None and row.leader and member.state == "running" else "",
                    self._shards_of(row) if row is not None and member.state == "running" else "",
                    str(d.by_member.get(name, 0)),
                ]
            )
        lines += view.table(["MEMBER", "PID", "STATE", "LEADER", "SHARDS", "CONSUMED"], rows)
        shards = self.status.streams.get(STREAM, ()) if self.status else ()
        shard_rows = [
            [
                _short(s.shard_id),
                s.owner or "-",
                _position(s.checkpoint.sequence_number if s.checkpoint else None),
                "-" if s.lag_ms is None else f"{s.lag_ms} ms",
            ]
            for s in shards
        ]
        lines += ["", *view.table(["SHARD", "OWNER", "CHECKPOINT", "LAG"], shard_rows)]
        if events:
            lines += ["", "events", *(f"  {e}" for e in self.events[-8:])]
        return lines

    def _shards_of(self, member: view.MemberView) -> str:
        return " ".join(_short(s.split("/", 1)[1]) for s in member.shards) or "-"

    def _event(self, text: str) -> None:
        line = f"[{time.monotonic() - self.t0:5.1f}s] {text}"
        self.events.append(line)
        if not self.tty:
            self._print(line)

    def _failure(self, text: str) -> None:
        self.failures.append(text)
        self._event(f"FAILED: {text}")

    def _print(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def _summary(self) -> int:
        """The final picture and the verdict: exit 1 when anything was lost or went wrong."""
        d = self.deliveries
        produced = self.producer.produced
        lost = [n for n in range(produced) if n not in d.by_number]
        extra = d.total - len(d.by_number)
        victim = self.victim.name if self.victim else None
        expected = sum(
            len(names) - 1 for names in d.by_number.values() if len(names) > 1 and victim in names
        )
        if not self.tty:
            self._print("")
            for line in self._frame(events=False):
                self._print(line)
        by_member = ", ".join(
            f"{name} {d.by_member.get(name, 0)}" + (" (killed)" if m.state == "killed" else "")
            for name, m in self.members.items()
        )
        if extra == expected:
            why = f"all re-deliveries of what {victim} had not checkpointed when it was killed"
        else:
            why = f"{expected} re-deliveries of {victim}'s records, {extra - expected} unexpected"
        lines = [
            "",
            "summary",
            f"  produced    {produced} records ({self.shards} shards)",
            f"  consumed    {len(d.by_number)} unique in {d.total} deliveries",
            f"  lost        {len(lost)}" + (f": {lost[:10]}" if lost else ""),
            f"  duplicates  {extra}" + (f" ({why})" if extra else ""),
            f"  by member   {by_member}",
        ]
        if self.takeover is not None:
            lines.append(
                f"  takeover    {victim}'s shards taken over {self.takeover:.1f}s after SIGKILL"
            )
        if self.joined is not None:
            lines.append(f"  join        {self.joined[0]} got its shards in {self.joined[1]:.1f}s")
        for failure in self.failures:
            lines.append(f"  problem     {failure}")
        if self.failures:
            lines.append(f"  logs        {self.logdir}")
        ok = not lost and not self.failures and produced == self.total
        lines.append("result: OK, nothing lost" if ok else "result: FAILED")
        for line in lines:
            self._print(line)
        return 0 if ok else 1


def _short(shard_id: str) -> str:
    return shard_id.rsplit("-", 1)[-1].lstrip("0") or "0"


def _position(sequence: str | None) -> str:
    if sequence is None:
        return "-"
    return sequence if len(sequence) <= 14 else "..." + sequence[-11:]
