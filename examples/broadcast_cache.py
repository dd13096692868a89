"""Broadcast: every process sees every record, to drop stale entries from its own local cache.

Each copy of a service keeps an in-memory cache; whoever changes an item puts its key on a
stream. With ``broadcast=True`` every copy reads every shard itself (no group, no claims, no
shared checkpoints), so every cache hears of every change. Run as many copies as you like.

    python examples/broadcast_cache.py        # until Ctrl-C
    python examples/broadcast_cache.py 100    # stop after 100 invalidations

Configuration: the environment variables of examples/basic.py, plus KINESUMER_CLIENT_ID. Without
it a copy starts at LATEST every time (a cache that starts empty has nothing stale to drop) and
writes nothing to DynamoDB. With it (one id per copy, kept across restarts) the copy saves its
own positions under that id (``broadcast_resume``) and resumes after them, so a long-lived cache
on disk misses no invalidation while its process was down.
"""

from __future__ import annotations

import os
import sys

from kinesumer import Config, Kinesumer

#: The local cache: item key -> value (here a few items, loaded at start).
cache: dict[str, str] = {f"item-{i}": f"value-{i}" for i in range(10)}


def main() -> None:
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else None
    client_id = os.environ.get("KINESUMER_CLIENT_ID")
    from_start = os.environ.get("KINESUMER_INITIAL_POSITION") == "TRIM_HORIZON"
    config = Config(
        app=os.environ.get("KINESUMER_APP", "examples"),
        dynamodb_table=os.environ.get("KINESUMER_TABLE", "kinesumer-state"),
        initial_position="TRIM_HORIZON" if from_start else "LATEST",
        broadcast=True,
        broadcast_resume=client_id is not None,
        client_id=client_id,
    )
    streams = os.environ.get("KINESUMER_STREAMS", "orders").split(",")
    seen = 0
    with Kinesumer(config) as consumer:
        print(f"broadcast on {', '.join(streams)} as {consumer.client_id}", flush=True)
        for record in consumer.consume(streams):
            key = record.data.decode()
            dropped = cache.pop(key, None) is not None
            print(f"invalidated {key} ({'dropped' if dropped else 'not cached'})", flush=True)
            seen += 1
            if seen == limit:
                break
    print(f"done: {seen} invalidations, {len(cache)} items cached", flush=True)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
