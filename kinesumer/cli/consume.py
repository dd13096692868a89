"""``kinesumer consume``: join the group as a member and print every record as a JSON line."""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import sys
import threading
from typing import Any

from ..consumer.sync import Kinesumer
from ..models import Record
from ..signals import stop_on_signals
from .errors import EXIT_OK
from .options import group_config


def record_json(record: Record) -> dict[str, Any]:
    """One record as ``consume`` prints it: data as text when it is UTF-8, else base64."""
    arrival = record.approximate_arrival_timestamp
    doc: dict[str, Any] = {
        "stream": record.stream,
        "shard_id": record.shard_id,
        "sequence_number": record.sequence_number,
        "sub_sequence_number": record.sub_sequence_number,
        "partition_key": record.partition_key,
        "approximate_arrival_timestamp": arrival.isoformat() if arrival else None,
    }
    try:
        doc["data"] = record.data.decode("utf-8")
    except UnicodeDecodeError:
        doc["data_b64"] = base64.b64encode(record.data).decode("ascii")
    return doc


def consume_command(args: argparse.Namespace) -> int:
    """A group member printing JSON lines.

    It polls (at most 0.5 s per poll) rather than iterating the blocking generator so that a
    stop request is seen within half a second even on an idle stream. The first SIGINT or
    SIGTERM lets the records of the current poll be printed, then closes from this thread, which
    counts them as processed: the checkpoints match exactly what was printed, and the next owner
    starts right after. A second one stops at once (``KeyboardInterrupt``).
    """
    config = group_config(
        args,
        client_id=args.client_id,
        initial_position=args.initial_position,
        broadcast=args.broadcast,
        broadcast_resume=args.resume,
        enhanced_fan_out=args.efo,
        consumer_name=args.consumer_name,
    )
    stop = threading.Event()
    if args.stop_on_stdin_eof:  # the demo's members: stop when the demo goes away
        threading.Thread(target=_stop_at_eof, args=(stop,), daemon=True).start()
    out = sys.stdout.buffer
    consumer = Kinesumer(config)
    printed = 0
    clean = False
    with stop_on_signals(lambda name: stop.set()):
        try:
            consumer.subscribe(args.streams)
            while not stop.is_set() and (args.count is None or printed < args.count):
                limit = 500 if args.count is None else min(500, args.count - printed)
                for record in consumer.poll(max_records=limit, timeout=0.5):
                    out.write(json.dumps(record_json(record), ensure_ascii=False).encode() + b"\n")
                    out.flush()
                    printed += 1
            clean = True
        finally:
            # Not clean (an error, a broken pipe, a second signal): what this poll delivered is
            # not known to be printed, so it is not checkpointed; the next owner delivers it
            # again.
            if clean:
                consumer.close()
            else:
                consumer.close(discard=True)
    return EXIT_OK


def _stop_at_eof(stop: threading.Event) -> None:
    """Raw reads of fd 0: a daemon thread blocked in the buffered ``sys.stdin`` would hold its
    lock and make the interpreter abort at exit."""
    with contextlib.suppress(OSError, ValueError):
        while os.read(sys.stdin.fileno(), 4096):
            pass
    stop.set()
