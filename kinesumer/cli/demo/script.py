"""The demo's script: set up moto's stream and table, start the members, kill one, add one,
stop them all, and watch the state table throughout (the library's own view of the group)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...admin import create_state_table
from ...aws import ClientFactory, RequestStats
from ...config import Config
from ...core import assign
from ...errors import TransientAWSError
from ...signals import signals_ignored
from ...statestore.dynamodb.store import DynamoDBStateStore
from ..view import GroupStatus, MemberView, collect
from .constants import APP, CLIENT_TIMEOUT, PHASE_TIMEOUT, REFRESH, REGION, STREAM, TABLE
from .display import frame, short, summary
from .members import Deliveries, Member, log_tail, start_member
from .producer import Producer


class _Abort(Exception):
    """A step did not happen in time; go straight to stopping and the summary."""


class Demo:
    """One run of the demo, from setup to summary."""

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
        self.status: GroupStatus | None = None
        self.producer = Producer(url, records, rate)
        self.logdir = Path(tempfile.mkdtemp(prefix="kinesumer-demo-"))
        self.loop = asyncio.new_event_loop()
        self.stack = contextlib.AsyncExitStack()
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
        return summary(self)

    def _setup(self) -> None:
        self.print(
            f"kinesumer demo: moto on {self.url}, stream {STREAM} ({self.shards} shards), "
            f"{self.size} members, {self.total} records at {self.rate:g}/s"
        )
        config = Config(
            app=APP,
            dynamodb_table=TABLE,
            region=REGION,
            dynamodb_endpoint=self.url,
            kinesis_endpoint=self.url,
        )
        factory = ClientFactory(config)
        kinesis: Any = factory.sync_kinesis()
        kinesis.create_stream(StreamName=STREAM, ShardCount=self.shards)
        kinesis.get_waiter("stream_exists").wait(
            StreamName=STREAM, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100}
        )
        create_state_table(config)
        db = self.loop.run_until_complete(self.stack.enter_async_context(factory.dynamodb()))
        self.store = DynamoDBStateStore(db, TABLE, APP, RequestStats())
        if self.tty:
            self.out.write("\x1b[?25l\x1b[2J")  # hide the cursor, clear the screen

    def _script(self) -> None:
        for index in range(1, self.size + 1):
            self._start_member(f"member-{index}")
        self._wait("the group to form", lambda: self._settled(size=self.size))
        self.formed = True
        owners = ", ".join(f"{m.client_id}: {self.shards_of(m)}" for m in self._live_members())
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
            lambda: self.producer.produced >= self.total and self.unique() >= self.total,
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
        member = start_member(name, self.url, self.logdir, self.deliveries)
        self.members[name] = member
        self._event(f"started {name} (pid {member.proc.pid})")
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
            f"SIGKILL {victim.name} (pid {victim.proc.pid}{role}, shards {self.shards_of(chosen)}"
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
                self._failure(f"{member.name} exited with {code}: {log_tail(member)}")
            if member.reader is not None:
                member.reader.join(timeout=10)
        self._event(f"stopped {len(running)} members (SIGTERM: checkpoints written, left group)")

    def _cleanup(self) -> list[int]:
        """Stop whatever is still running, each child by its own pid; Ctrl-C cannot cut this
        short (signals are ignored meanwhile)."""
        stopped = []
        with signals_ignored():
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
        return stopped

    # -- state ------------------------------------------------------------------------------
    def _refresh(self) -> None:
        """Read the table, notice exits, ownership and leader changes, redraw."""
        assert self.store is not None
        with contextlib.suppress(TransientAWSError):
            self.status = self.loop.run_until_complete(
                collect(
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
                self._failure(f"{member.name} exited with {code}: {log_tail(member)}")
        if self.status is not None:
            self._notice_changes(self.status)
        if self.tty:
            self.out.write(
                "\x1b[H"
                + "".join(
                    f"{line}\x1b[K\n"
                    for line in frame(
                        self,
                    )
                )
            )
            self.out.write("\x1b[J")
            self.out.flush()

    def _notice_changes(self, status: GroupStatus) -> None:
        for shard in status.streams.get(STREAM, ()):
            if shard.owner is None or not shard.owner_live:
                continue
            before = self.owners.get(shard.shard_id)
            self.owners[shard.shard_id] = shard.owner
            if self.formed and before is not None and before != shard.owner:
                how = "took it over from the killed member" if self._killed(before) else "handoff"
                self._event(f"shard {short(shard.shard_id)}: {before} -> {shard.owner} ({how})")
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

    def _live_members(self) -> list[MemberView]:
        return [m for m in self.status.members if m.live] if self.status else []

    def unique(self) -> int:
        with self.deliveries.lock:
            return len(self.deliveries.by_number)

    # -- output -----------------------------------------------------------------------------
    def shards_of(self, member: MemberView) -> str:
        return " ".join(short(s.split("/", 1)[1]) for s in member.shards) or "-"

    def _event(self, text: str) -> None:
        line = f"[{time.monotonic() - self.t0:5.1f}s] {text}"
        self.events.append(line)
        if not self.tty:
            self.print(line)

    def _failure(self, text: str) -> None:
        self.failures.append(text)
        self._event(f"FAILED: {text}")

    def print(self, text: str) -> None:
        print(text, file=self.out, flush=True)
