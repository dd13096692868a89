"""What the source tells of each batch once it was read: per shard where its read ended, how
many records, and how far behind the shard's tip it stopped; logged at INFO, and in the query's
progress as the source's ``latestOffset``.

What pyspark 4.3 lets a Python source report, and what it does not:

- ``endOffset`` in a batch's progress is the offset ``latestOffset`` returned when the batch was
  *planned*, written to the checkpoint before it ran. Kinesis has no high-water mark, so that
  offset names each shard's **start** and a limit (:mod:`.offsets`); where the read ended is
  known only after the executors read (:mod:`.ledger`). Spark never asks the source again, so
  ``endOffset`` cannot hold a batch's real ends: batch N+1's ``endOffset`` holds the starts that
  follow batch N's ends.
- There is no custom-metrics hook for Python sources (the JVM's ``ReportsSourceMetrics``, which
  the Kafka source uses for ``avgOffsetsBehindLatest``, has no Python counterpart).
- ``reportLatestOffset()`` is called right after each ``latestOffset`` and shown as the source's
  ``latestOffset`` in the progress. The planner reads the ledger of the previous batch in that
  ``latestOffset``, so the report holds the planned offset plus ``"read"``: :func:`read_report`
  of the batch read last (its real ends, records, and lag).

Lag is ``MillisBehindLatest`` of the read's last GetRecords answer (Kinesis's own measure: no
clock of ours is compared with AWS's). Records behind cannot be given: no Kinesis call returns
a shard's last sequence number or a count without reading the records.
"""

from __future__ import annotations

import logging
from typing import Any

from ..ledger import LedgerEntry
from ..offsets import shard_name

log = logging.getLogger("kinesumer.spark.source")

Key = tuple[str, str]


def read_report(batch: int, ends: dict[Key, LedgerEntry]) -> dict[str, Any]:
    """Batch ``batch`` as read (its ledger items ``ends``), as JSON-ready values."""
    behind = [e.millis_behind for e in ends.values() if e.millis_behind is not None]
    return {
        "batch": batch,
        "records": sum(e.count for e in ends.values()),
        "max_millis_behind": max(behind) if behind else None,
        # Databricks' Kinesis source's names for the same figures (its `metrics`; a Python
        # source has none, so they are here), for dashboards and alerts written for it.
        "avgMsBehindLatest": round(sum(behind) / len(behind), 1) if behind else None,
        "maxMsBehindLatest": max(behind) if behind else None,
        "minMsBehindLatest": min(behind) if behind else None,
        "shards": {
            shard_name(*key): {
                "end": None if e.end is None else e.end.sequence_number,
                "records": e.count,
                "millis_behind": e.millis_behind,
                "caught_up": e.caught_up,
                "shard_end": e.shard_end,
            }
            for key, e in sorted(ends.items())
        },
    }


def log_read(report: dict[str, Any]) -> None:
    """One INFO line per batch read: records, the largest lag, and each shard's end and lag."""
    shards = ", ".join(
        f"{name} {s['records']} to {s['end'] or '-'} ({s['millis_behind']} ms behind)"
        for name, s in report["shards"].items()
    )
    log.info(
        "batch %d read: %d records, at most %s ms behind the tip: %s",
        report["batch"], report["records"], report["max_millis_behind"], shards,
    )  # fmt: skip
