"""Consume from asyncio with AsyncKinesumer: ``async with`` and ``async for``.

The same consumer group as examples/basic.py (the two can even be members of one group): one
engine (asyncio + aioboto3) drives both APIs. Here the handler is a coroutine, so a slow
``await`` in it (an HTTP call, a database write) does not block the event loop, and the
library's fetchers keep reading ahead into its bounded buffer meanwhile.

    python examples/async_consumer.py [N]      # stop after N records (default: until Ctrl-C)

Configuration: the same environment variables as examples/basic.py (KINESUMER_APP,
KINESUMER_TABLE, KINESUMER_STREAMS, KINESUMER_INITIAL_POSITION, and boto3's own AWS_*).
"""

from __future__ import annotations

import asyncio
import os
import sys

from kinesumer import AsyncKinesumer, Config, Record


async def handle(record: Record) -> None:
    """Stands for real work: anything awaited here lets other tasks run."""
    await asyncio.sleep(0)
    print(
        f"{record.stream}/{record.shard_id} #{record.sequence_number} "
        f"key={record.partition_key} data={record.data!r}",
        flush=True,
    )


async def main(limit: int | None) -> None:
    from_start = os.environ.get("KINESUMER_INITIAL_POSITION") == "TRIM_HORIZON"
    config = Config(
        app=os.environ.get("KINESUMER_APP", "examples"),
        dynamodb_table=os.environ.get("KINESUMER_TABLE", "kinesumer-state"),
        initial_position="TRIM_HORIZON" if from_start else "LATEST",
    )
    streams = os.environ.get("KINESUMER_STREAMS", "orders").split(",")
    seen = 0
    async with AsyncKinesumer(config) as consumer:
        print(f"consuming {', '.join(streams)} as {consumer.client_id}", flush=True)
        async for record in consumer.consume(streams):
            await handle(record)
            seen += 1
            if seen == limit:
                break  # leaving `async with` closes: checkpoints written, shards handed off
        stats = consumer.stats()
        print(f"leader={stats.leader} checkpoint writes={stats.checkpoint_writes}", flush=True)
    print(f"done: {seen} records", flush=True)


if __name__ == "__main__":
    try:
        asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else None))
    except KeyboardInterrupt:
        sys.exit(130)
