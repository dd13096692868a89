"""The handler runner's pure parts driven by hand: numbered records, a lease with its low-water
tracker, and a dispatcher over them (the handler tests that need no stream)."""

from __future__ import annotations

from typing import Any

from kinesumer.handlers.options import run_options
from kinesumer.models import Checkpoint, Record
from kinesumer.read.progress import ShardLease, shard_lease


def record(seq: int, key: str = "k", shard: str = "shard-0") -> Record:
    return Record("s", shard, f"{seq:056d}", 0, key, b"", None)


# -- run()'s checks --------------------------------------------------------------------------
def handle(record: Record) -> None:
    pass


GOOD: dict[str, Any] = {
    "concurrency": 1,
    "ordering": "shard",
    "max_in_flight": None,
    "batch": None,
    "on_failure": None,
    "decode": None,
    "sink": None,
    "name": None,
}


# -- the dispatcher's bookkeeping --------------------------------------------------------------
def dispatch_for(**changes: Any) -> Any:
    from kinesumer.handlers.dispatch import Dispatch
    from kinesumer.read.delivery import Cursor

    options = run_options(handle, is_async=False, **{**GOOD, **changes})
    return Dispatch(options, Cursor(auto_commit=True))


def lease_of(shard: str) -> ShardLease:
    return shard_lease(Checkpoint("s", shard, owner="me", lease=1))
