"""Manual commit: checkpoint only after your side effect succeeded (auto_commit=False).

Records come in batches (``poll()``); each batch is written to the sink first and committed
second, so a crash between the two replays the batch (at-least-once) and never skips it. With
``auto_commit=False`` a record counts as processed only when ``commit()`` is called, and closing
does *not* commit for you: whatever was delivered after the last commit is delivered again to the
next owner of its shard.

    python examples/manual_commit.py [N]   # stop after N records (default: until Ctrl-C)

Configuration: the environment variables of examples/basic.py, plus KINESUMER_BATCH (records
per batch, default 100). The sink here is standard output; make yours idempotent, keyed by
(stream, shard_id, sequence_number, sub_sequence_number), and replays become harmless.
"""

from __future__ import annotations

import os
import sys

from kinesumer import Config, Kinesumer, Record


def write_to_sink(batch: list[Record]) -> None:
    for record in batch:
        print(f"{record.stream}/{record.shard_id} #{record.sequence_number} data={record.data!r}")
    sys.stdout.flush()


def main() -> None:
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else None
    batch_size = int(os.environ.get("KINESUMER_BATCH", "100"))
    from_start = os.environ.get("KINESUMER_INITIAL_POSITION") == "TRIM_HORIZON"
    config = Config(
        app=os.environ.get("KINESUMER_APP", "examples"),
        dynamodb_table=os.environ.get("KINESUMER_TABLE", "kinesumer-state"),
        initial_position="TRIM_HORIZON" if from_start else "LATEST",
        auto_commit=False,
    )
    streams = os.environ.get("KINESUMER_STREAMS", "orders").split(",")
    total = 0
    with Kinesumer(config) as consumer:
        consumer.subscribe(streams)
        while limit is None or total < limit:
            want = batch_size if limit is None else min(batch_size, limit - total)
            # A full batch, or whatever arrived within a second: a quiet stream does not hold
            # a partial batch back.
            batch = consumer.poll(max_records=want, timeout=1.0)
            if not batch:
                continue
            write_to_sink(batch)  # the side effect first ...
            consumer.commit()  # ... then the checkpoint of everything delivered so far
            total += len(batch)
            print(f"committed {len(batch)} records ({total} in all)", flush=True)
    print(f"done: {total} records", flush=True)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)  # uncommitted records are delivered again: that is the point
