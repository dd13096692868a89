"""Consume streams as a group member with the blocking generator: the smallest real program.

Run as many copies as you like (on one machine or many): each shard is read by exactly one live
copy, and a copy that stops hands its shards to the others.

    export KINESUMER_APP=orders-etl KINESUMER_TABLE=kinesumer-state KINESUMER_STREAMS=orders
    python examples/basic.py          # until Ctrl-C
    python examples/basic.py 100      # stop after 100 records

Configuration (environment):
    KINESUMER_APP               the consumer group's name (default "examples")
    KINESUMER_TABLE             the DynamoDB state table (default "kinesumer-state")
    KINESUMER_STREAMS           comma-separated stream names (default "orders")
    KINESUMER_INITIAL_POSITION  LATEST (default) or TRIM_HORIZON: where a shard without a
                                checkpoint starts
    AWS_REGION, AWS_PROFILE ... boto3's usual settings; AWS_ENDPOINT_URL_KINESIS and
                                AWS_ENDPOINT_URL_DYNAMODB point it at local stand-ins (moto)

Breaking out of the loop is a clean stop: leaving the ``with`` block closes the consumer, which
counts the record in hand as processed, writes the checkpoints and hands the shards off, so the
next run starts right after the last record printed. (Ctrl-C also stops it, but the record in hand
is then delivered again next time: see graceful_shutdown.py for a stop on signals that repeats
nothing.)
"""

from __future__ import annotations

import os
import sys

from kinesumer import Config, Kinesumer


def main() -> None:
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else None
    from_start = os.environ.get("KINESUMER_INITIAL_POSITION") == "TRIM_HORIZON"
    config = Config(
        app=os.environ.get("KINESUMER_APP", "examples"),
        dynamodb_table=os.environ.get("KINESUMER_TABLE", "kinesumer-state"),
        initial_position="TRIM_HORIZON" if from_start else "LATEST",
    )
    streams = os.environ.get("KINESUMER_STREAMS", "orders").split(",")
    seen = 0
    with Kinesumer(config) as consumer:
        print(f"consuming {', '.join(streams)} as {consumer.client_id}", flush=True)
        for record in consumer.consume(streams):
            print(
                f"{record.stream}/{record.shard_id} #{record.sequence_number} "
                f"key={record.partition_key} data={record.data!r}",
                flush=True,
            )
            seen += 1
            if seen == limit:
                break
    print(f"done: {seen} records", flush=True)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
