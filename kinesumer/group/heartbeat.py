"""Heartbeats on a thread of their own, and the fence they keep.

Liveness must not depend on how busy the engine's event loop is: parsing a 10,000-record
GetRecords answer holds the loop for a few hundred milliseconds, and an async application may do
slow work on the same loop. Either would delay a loop-based heartbeat, make the member fence
itself, and set off needless rebalances. As the KCL renews leases on its own thread, this thread
writes the client item every ``heartbeat_interval`` with its own (blocking) boto3 client.

It also keeps the *fence*: the moment after which this member must not deliver any more,
because the others may by then consider it dead.

The arithmetic (``T`` = ``client_timeout``, ``h`` = ``heartbeat_interval``, ``T >= 2h``)::

    sent            the monotonic moment (ours) a heartbeat was sent; every heartbeat writes a
                    new *token* (``last_update`` and a beat counter), so the item changes
    fence           sent + T - m, with m = FENCE_MARGIN * T (10%), for the last heartbeat that
                    *landed* (was acknowledged); we deliver nothing from then on
    others          call us dead when our token has not changed for T *on their own monotonic
                    clock* (:mod:`kinesumer.core.liveness`); no wall clock is compared
    next heartbeat  sent + h; it must *land* before the fence: T - m - h >= 0.8h of slack
                    at the tightest allowed ratio (T = 2h), 1.7h at T = 3h

**Why the fence always comes first, whatever the wall clocks say.** An observer O judges us
dead on a strongly consistent read that started at ``r`` (O's clock) and still returned token
``X``, which O first saw in an answer it received at ``f``, with ``r - f >= T``. (1) ``X`` was
written by a heartbeat sent at ``s_X`` (our clock) and in O's answer by ``f``, so it was sent
before ``f``: ``s_X <= f`` as a moment in real time. (2) Every heartbeat acknowledged before
``r`` is in the answer of a read started at ``r``; that answer still holds ``X``, so each of them
landed no later than ``X`` did, and was sent before ``f`` too. So at ``r`` the latest heartbeat we
know landed was sent at some ``s <= f``, and our fence stood at ``s + 0.9T <= f + 0.9T <= r -
0.1T``: we had stopped delivering at least ``0.1T`` before O's verdict. (3) A heartbeat that lands
only after ``r`` finds the fence passed: that is a *lapse* (below), every lease held across it is
lost and claimed again, conditionally. Only durations enter the argument, each measured on one
host's monotonic clock (rates agree to parts per million, far inside the 10% margin), so members
whose wall clocks disagree by minutes judge each other as correctly as synchronised ones.
Followers of the leader's membership view judge by the leader's verdict, made this way
(membership.py); a view read late only makes them call us dead later.

The old rule (m = h) put the fence exactly where the next heartbeat is sent when T = 2h: any
latency on that write passed the fence, and a healthy member fenced itself. A margin taken from
T keeps a slack that grows with the ratio. A heartbeat that failed is retried after h/2 rather
than h, so at T = 2h a quick failure still leaves a second try before the fence. botocore's
connect and read timeouts are the slack T - m - h (half a second at least): a write stuck on a
dead connection is given up and retried on a fresh one while that can still help.

A fence that passed stays passed until the watchdog noticed (:meth:`Heartbeat.resume`): a
heartbeat landing after the fence does not reopen it by itself, so the leases held across the
lapse are always lost (the others may have taken those shards meanwhile) and claimed again,
conditionally, even when the watchdog was held up (a busy event loop) for the whole lapse.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from .._version import __version__
from ..aws import ClientFactory, RequestStats
from ..config import Config
from ..models import ClientInfo
from ..statestore.dynamodb import client_item

log = logging.getLogger("kinesumer.heartbeat")

#: The fence falls this fraction of ``client_timeout`` before the others may call us dead.
FENCE_MARGIN = 0.1


def fence_after(config: Config) -> float:
    """Seconds from a landed heartbeat's send to the fence: ``client_timeout * 0.9``."""
    return config.client_timeout * (1.0 - FENCE_MARGIN)


def heartbeat_slack(config: Config) -> float:
    """How late a heartbeat sent on schedule may land without passing the fence."""
    return fence_after(config) - config.heartbeat_interval


class Heartbeat:
    def __init__(
        self,
        config: Config,
        client_id: str,
        streams: Callable[[], tuple[str, ...]],
        owned: Callable[[], dict[str, int]] = dict,
        stats: RequestStats | None = None,
        efo_stalls: Callable[[], dict[str, int]] = dict,
        write: Callable[[ClientInfo, int], None] | None = None,
        home: Callable[[], str] = str,
    ) -> None:
        self._config = config
        self._home = home
        #: Writes the client item (blocking); None: a boto3 client of the member's own, made
        #: by :meth:`start`, puts it into the DynamoDB table.
        self._write = write
        self._efo_stalls = efo_stalls
        self._stats = stats
        self._client_id = client_id
        self._streams = streams
        self._owned = owned
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # the heartbeat thread and the loop both land heartbeats
        self.last_sent_ok = time.monotonic()
        #: Until when (monotonic) our leases are safe to use: a plain attribute, as the delivery
        #: side reads it for every record.
        self.deadline = self._deadline_after(self.last_sent_ok)
        #: The deadline a heartbeat that landed after the fence earned, held back until the
        #: watchdog lost the leases of the lapse (:meth:`resume`); None when no lapse is pending.
        self._held_deadline: float | None = None
        self._landed_any = False  # before the first heartbeat lands no lease exists to lose
        #: Fences that passed before a heartbeat landed again (each one lost every lease).
        self.lapses = 0
        self.last_attempt = 0.0
        self.failures = 0
        self.last_error: BaseException | None = None
        self._last_failed = False
        self._beats = 0  # heartbeats sent by this process: part of the token others watch

    def _deadline_after(self, sent: float) -> float:
        """The fence set by a heartbeat sent at ``sent``: the module docstring has the why."""
        return sent + fence_after(self._config)

    def landed(self, sent: float) -> None:
        """Record a heartbeat (sent at monotonic time ``sent``) that DynamoDB accepted. Called
        by the heartbeat thread and by ``Membership.announce`` on the loop."""
        with self._lock:
            if sent <= self.last_sent_ok:
                return
            self.last_sent_ok = sent
            earned = self._deadline_after(sent)
            first, self._landed_any = not self._landed_any, True
            if self._held_deadline is not None:
                self._held_deadline = earned  # still in a lapse the watchdog has not seen
            elif not first and time.monotonic() >= self.deadline:
                # The fence passed before this landed: others may have taken our shards in
                # between. Keep it closed until the watchdog has lost every lease (resume()).
                self._held_deadline = earned
                self.lapses += 1
            else:
                self.deadline = earned

    @property
    def lapsed(self) -> bool:
        """A heartbeat landed after the fence had passed; :meth:`resume` not called yet."""
        return self._held_deadline is not None

    def resume(self) -> None:
        """The watchdog (on the loop), once it lost every lease held across a lapse: open the
        fence again at the deadline the late heartbeat earned."""
        with self._lock:
            if self._held_deadline is not None:
                self.deadline, self._held_deadline = self._held_deadline, None

    def info(self) -> ClientInfo:
        """The client item of the next heartbeat, with a new token (the beat counts up)."""
        with self._lock:
            self._beats += 1
            beat = self._beats
        return ClientInfo(
            client_id=self._client_id,
            beat=beat,
            last_update_ms=int(time.time() * 1000),
            streams=frozenset(self._streams()),
            host=socket.gethostname(),
            pid=os.getpid(),
            version=__version__,
            owned=self._owned(),
            efo_stalls=self._efo_stalls(),
            assignment=self._config.assignment,
            home=self._home(),
        )

    @property
    def interval(self) -> float:
        """``heartbeat_interval``: how often the item changes while this member lives."""
        return self._config.heartbeat_interval

    @property
    def ttl_seconds(self) -> int:
        """The item's ``expires_at`` (stamped by our wall clock) only collects the garbage of a
        member that vanished: generous enough that no clock skew makes it matter (liveness is
        judged by change, not by this)."""
        return int(max(self._config.client_timeout * 10, 3600))

    def start(self) -> None:
        if self._write is None:
            self._write = self._dynamodb_writer()
        self._thread = threading.Thread(
            target=self._run, name=f"kinesumer-heartbeat-{self._client_id}", daemon=True
        )
        self._thread.start()

    def _dynamodb_writer(self) -> Callable[[ClientInfo, int], None]:
        config = self._config
        factory = ClientFactory(config, self._stats)
        # Half a second at least: below that a loopback or same-region call may time out.
        timeout = max(0.5, heartbeat_slack(config))
        client = factory.sync_dynamodb(attempts=2, timeout=timeout)

        def write(info: ClientInfo, ttl_seconds: int) -> None:
            client.put_item(
                TableName=config.dynamodb_table, Item=client_item(config.app, info, ttl_seconds)
            )

        return write

    def halt(self) -> None:
        """Stop heartbeating without waiting (safe on the event loop): a failed engine must look
        dead to the others, or its shards would be stranded."""
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 3 * self._config.heartbeat_interval))

    def _run(self) -> None:
        interval = self._config.heartbeat_interval
        while True:
            # After a failure, try again sooner: at T = 2h a retry at h/2 can still land in time.
            pause = interval / 2 if self._last_failed else interval
            if self._stop.wait(max(0.0, self.last_attempt + pause - time.monotonic())):
                return
            self.beat()

    def beat(self) -> None:
        sent = self.last_attempt = time.monotonic()
        try:
            assert self._write is not None, "beat() before start()"
            self._write(self.info(), self.ttl_seconds)
        except Exception as exc:  # every failure is logged and counted; the fence acts on them
            self.failures += 1
            self.last_error = exc
            self._last_failed = True
            log.warning(
                "[%s] heartbeat failed (%d so far; fencing in %.1fs): %s",
                self._client_id,
                self.failures,
                max(0.0, self.deadline - time.monotonic()),
                exc,
            )
            return
        self._last_failed = False
        self.landed(sent)
