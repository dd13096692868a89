"""The text ``kinesumer status`` and ``checkpoints list`` print: plain aligned columns that
survive pipes, ``grep`` and CI logs.

Every string read from the state table (client ids, hosts, stream names, owners) may have been
written by anyone with write access to the table: :func:`printable` escapes the characters a
terminal would act on (ANSI escapes that move the cursor, rewrite the title or clear the screen;
bidirectional overrides that reorder what is shown) before anything reaches the screen.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence

from .view import GroupStatus, ShardView, iso_time


def render(status: GroupStatus) -> list[str]:
    """The text ``kinesumer status`` prints: members (``*`` marks the leader), then one table of
    shards per stream."""
    live = len(status.live_ids)
    lines = [
        f"app {status.app}  table {status.table}  {iso_time(status.now_ms)}  "
        f"{live} live member{'' if live == 1 else 's'} (client timeout {status.client_timeout:g}s)",
        "",
    ]
    if status.members:
        rows = [
            [
                ("* " if m.leader else "  ") + m.client_id,
                "live" if m.live else "dead",
                f"{(status.now_ms - m.info.last_update_ms) / 1000:.1f}s ago",
                f"{m.info.host}/{m.info.pid}",
                ",".join(sorted(m.info.streams)) or "-",
                str(len(m.shards)),
            ]
            for m in status.members
        ]
        lines += table(["  MEMBER", "STATE", "HEARTBEAT", "HOST/PID", "STREAMS", "SHARDS"], rows)
        lines.append("  (* leader: the lowest live client id not stepped down)")
    else:
        lines.append("no members registered")
    for stream, shards in sorted(status.streams.items()):
        finished = sum(1 for s in shards if s.finished)
        lines += ["", f"stream {stream}: {len(shards)} shards, {finished} finished"]
        lines += shard_table(shards, status.now_ms)
        lines += [
            f"  shard {s.shard_id}: EFO stalled {s.efo_stalls} times"
            for s in shards
            if s.efo_stalls
        ]
    if not status.streams:
        lines += ["", "no streams: no member has joined this app yet"]
    return lines


def shard_table(shards: Iterable[ShardView], now_ms: int, *, lease: bool = False) -> list[str]:
    headers = ["SHARD", "STATE", "OWNER", "CHECKPOINT", "LAG", "UPDATED"]
    if lease:
        headers.insert(3, "LEASE")
    rows = []
    for view in shards:
        checkpoint = view.checkpoint
        row = [
            view.shard_id,
            view.state,
            view.owner or "-",
            view.resumes_at,
            "-" if view.lag_ms is None else f"{view.lag_ms} ms",
            _age(now_ms, checkpoint.last_update_ms) if checkpoint else "-",
        ]
        if lease:
            row.insert(3, str(checkpoint.lease) if checkpoint else "-")
        rows.append(row)
    return table(headers, rows) if rows else ["  (no shards known yet)"]


def printable(text: str) -> str:
    """``text`` with control and format characters (categories Cc, Cf, Zl, Zp: ESC, CR, BEL,
    DEL, C1 controls, bidirectional overrides, zero-width characters, line separators) written
    as Python escapes (``\\x1b``, ``\\u202e``); newlines too: one item, one line."""
    if text.isprintable():
        return text
    return "".join(_escape(ch) if unicodedata.category(ch) in _UNSAFE else ch for ch in text)


def printable_lines(lines: Iterable[str]) -> str:
    """Lines joined by newlines, each made :func:`printable`."""
    return "\n".join(printable(line) for line in lines)


_UNSAFE = frozenset({"Cc", "Cf", "Zl", "Zp"})


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns, two spaces apart, indented by two; cells made :func:`printable`
    (before measuring: an escape is as wide as it is shown)."""
    cells = [list(headers), *([printable(str(cell)) for cell in row] for row in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return [
        "  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in cells
    ]


def _age(now_ms: int, then_ms: int) -> str:
    if not then_ms:
        return "-"
    seconds = max(0.0, (now_ms - then_ms) / 1000)
    return f"{seconds:.1f}s ago" if seconds < 120 else f"{seconds / 60:.0f}m ago"
