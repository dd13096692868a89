"""Tables, plots and the site's Measured page (docs/measured.md) of the benchmark suite
(``benchmarks/run.py``)."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def command(r: dict[str, Any]) -> str:
    """The command that produced ``r`` (``quick`` is recorded by ``run_all``): every figure
    names the command it came from."""
    return "./scripts/bench --quick" if r.get("quick") else "./scripts/bench"


def tables(r: dict[str, Any]) -> str:
    lines = [
        f"Measured by `{command(r)}` on {r['finished']}; machine: {r['machine']}. "
        "kinesalite + dynalite on loopback (single-threaded Node servers on the same cores: "
        "their ceiling is part of every figure), library defaults unless stated.",
        "",
        "**Throughput**: one `AsyncKinesumer` member vs a plain aioboto3 loop (one task per "
        "shard, GetRecords every 0.2 s) over the same pre-filled stream; steady state, median "
        "of 3 alternating rounds. CPU is client process CPU seconds per 100k records.",
        "",
        "| shards | record | records | plain rec/s | kinesumer rec/s | ratio | plain CPU | "
        "kinesumer CPU | CPU ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in r["throughput"]:
        size = f"{c['size'] // 1024} KB" if c["size"] >= 1024 else f"{c['size']} B"
        lines.append(
            f"| {c['shards']} | {size} | {c['records']} | {c['plain_rate']:.0f} | "
            f"{c['kinesumer_rate']:.0f} | {c['rate_ratio']:.2f}x | {c['plain_cpu']:.2f} s | "
            f"{c['kinesumer_cpu']:.2f} s | {c['cpu_ratio']:.2f}x |"
        )
    plain = r["scaling"][0]["plain_records_per_s"]
    lines += [
        "",
        "**Group scaling**: member processes draining one pre-filled 16-shard stream "
        f"(aggregate, first record to last); one plain-loop process on it: {plain:.0f} rec/s.",
        "",
        "| members | records/s | vs plain loop |",
        "|---:|---:|---:|",
    ]
    for s in r["scaling"]:
        lines.append(
            f"| {s['members']} | {s['records_per_s']:.0f} | {s['records_per_s'] / plain:.2f}x |"
        )
    fo = r["failover"]
    lines += [
        "",
        f"**Failover** (3 member processes, 6 shards, defaults; median of {len(fo)}): "
        "seconds until the shards are read again.",
        "",
        "| event | seconds | aim |",
        "|---|---:|---:|",
    ]
    for key, label, aim in (
        ("crash", "SIGKILL of a member", "< 5"),
        ("leave", "graceful leave (SIGTERM)", "< 2"),
        ("join", "join (newcomer up -> balanced, reading)", "< 2"),
    ):
        lines.append(f"| {label} | {statistics.median(x[key] for x in fo):.2f} | {aim} |")
    lines += [
        "",
        "**State-store cost** per member per minute (members of one app in one process, 16 "
        "shards; busy = 400 records/s produced), and GetRecords per shard per second "
        "(the service allows 5).",
        "",
        "| members | idle DynamoDB calls | idle capacity units | busy calls | busy capacity units "
        "| GetRecords/shard/s idle | busy |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in r["cost"]:
        lines.append(
            f"| {c['members']} | {c['idle_calls']:.0f} | {c['idle_capacity']:.0f} | "
            f"{c['busy_calls']:.0f} | {c['busy_capacity']:.0f} | {c['idle_getrecords']:.2f} | "
            f"{c['busy_getrecords']:.2f} |"
        )
    a, i = r["assignment"], r["items"]
    lines += [
        "",
        f"**Assignment scale**: the whole group's assignment for {a['members']} members x "
        f"{a['shards']} shards in {a['seconds'] * 1000:.1f} ms (median of 5; every member "
        f"computes it each tick). **Item sizes at {i['shards']} shards** (+{i['shards'] // 2} "
        f"closed parents), DynamoDB limit {i['limit'] // 1024} KB: shard cache "
        f"{i['cache_json'] / 1e6:.1f} MB JSON -> {i['cache_compressed'] / 1024:.0f} KB zlib in "
        f"{i['cache_chunks']} chunk item(s), largest {i['largest_cache_item'] / 1024:.0f} KB; "
        f"client item {i['client_item']} B (capped at 1 KB: one write unit per heartbeat); "
        f"checkpoint item {i['checkpoint_item']} B.",
        "",
        "**Memory**: peak RSS of a member process whose application takes 1 ms per record, "
        "reading 4 shards of 100 B records; `max_buffered_records` 20,000.",
        "",
        "| backlog | records consumed | peak buffered | peak RSS |",
        "|---:|---:|---:|---:|",
    ]
    for m in r["memory"]:
        lines.append(
            f"| {m['backlog']:,} | {m['consumed']:,} | {m['peak_buffered']:,} | "
            f"{m['peak_rss_mb']:.0f} MB |"
        )
    if r.get("spark"):
        import bench_spark  # only with the spark extra, as run.py measured it

        lines += [
            "",
            "**Spark**: `foreach_batch` vs the streaming source (`readStream`) on one pre-filled "
            "stream, `local[1]` vs `local[2]` where measured.",
            "",
            bench_spark.table(r["spark"]),
        ]
    lines += flat_cost_tables(r)
    lines += handlers_table(r.get("handlers"))
    lines += sinks_table(r.get("sinks"))
    lines += producer_table(r.get("producer"))
    if r.get("read"):
        import bench_read

        read = r["read"]
        lines += ["", bench_read.report(read["table"], read["records"], read["rounds"])]
    if r.get("spark_sink"):
        import bench_spark_sink

        sink = r["spark_sink"]
        lines += ["", bench_spark_sink.report(sink["table"], sink["records"], sink["master"])]
    lines += assignment_modes_table(r.get("assignment_modes"))
    if r.get("efo"):
        import bench_efo

        lines += ["", bench_efo.report(r["efo"])]
    if r.get("dynamodb_streams"):
        import bench_dynamodb_streams

        lines += ["", "```", bench_dynamodb_streams.report(r["dynamodb_streams"]), "```"]
    if r.get("streams_by_arn"):
        import bench_streams_by_arn

        lines += ["", "```", bench_streams_by_arn.report(r["streams_by_arn"]), "```"]
    total = sum(r["seconds"].values())
    lines += ["", f"Suite wall time {total / 60:.1f} min.", ""]
    return "\n".join(lines)


def flat_cost_tables(r: dict[str, Any]) -> list[str]:
    """Per member-minute cost before (every member reads every client item) and after (followers
    read the leader's view), simulated large groups (bench_cost.py)."""
    if not r.get("flat_cost"):
        return []
    import bench_cost

    return [
        "",
        "**Cost as the group grows**, idle, 16 shards, defaults: per member-minute, averaged over "
        "the group (groups above 3 simulated: a load process rewrites full 1 KB client items every "
        "second; one real leader and follower measured). *Before*: every member Queries every "
        "client item each tick; *after*: followers read the leader's small view head "
        "(on-demand prices, us-east-1: $1.25 per million write units, $0.25 per million read "
        "units).",
        "",
        *bench_cost.table(r["flat_cost"]),
        "",
        "The same at the Go library's timing (`heartbeat_interval=5`, `client_timeout=10`; the Go "
        "library makes about 48 calls per follower-minute):",
        "",
        *bench_cost.table(r["go_timing_cost"]),
    ]


def handlers_table(h: dict[str, Any] | None) -> list[str]:
    """``run()`` against the plain iterator (bench_handlers.py)."""
    if not h:
        return []
    rps, cpu = h["records_per_s"], h["cpu_us_per_record"]
    wait = h["io_seconds"] * 1000
    return [
        "",
        f"**Handlers** (`run()`): a handler waiting {wait:.0f} ms per record (an I/O call), "
        f"4 pre-filled shards, one member; median of {h['rounds']}.",
        "",
        "| how | records/s | vs the iterator |",
        "|---|---:|---:|",
        f"| `for record in consume(): handle(record)` | {rps['iterator']:,.0f} | 1.0x |",
        f'| `run(..., ordering="key", concurrency=64)` | {rps["run_key_64"]:,.0f} | '
        f"{h['speedup_key_64']:.1f}x |",
        f'| `run(..., ordering="none", concurrency=64)` | {rps["run_none_64"]:,.0f} | '
        f"{h['speedup_none_64']:.1f}x |",
        "",
        f"A handler that does nothing: CPU per record of the whole process, `consume()` "
        f"{cpu['iterator']:.1f} us vs `run()` (concurrency 1: the handler runs inline) "
        f"{cpu['run_inline']:.1f} us: **{h['cpu_ratio']:.2f}x**.",
    ]


def producer_table(p: dict[str, Any] | None) -> list[str]:
    """The Producer vs a plain boto3 loop (bench_producer.py)."""
    if not p:
        return []
    import bench_producer

    return bench_producer.report(p).split("\n")


def sinks_table(k: dict[str, Any] | None) -> list[str]:
    """Exactly-once sinks beside plain ones (bench_sinks.py)."""
    if not k:
        return []
    rate, ratio, batch = k["records_per_s"], k["ratio_to_plain"], k["batch"]
    lines = [
        "",
        f"**Exactly-once sinks** vs a plain sink doing the same writes (4 shards; DynamoDB on "
        f"moto, whose transactions copy the tables they touch, so those figures are moto's; "
        f"PostgreSQL 15 on loopback); median of {k['rounds']}.",
        "",
        "| sink | plain records/s | exactly-once records/s | ratio |",
        "|---|---:|---:|---:|",
    ]
    for store, label in (("dynamodb", "DynamoDB"), ("postgres", "PostgreSQL")):
        for suffix, how in (("", "per record"), ("_batch", f"batches of {batch}")):
            plain, exact = f"{store}_plain{suffix}", f"{store}_exactly_once{suffix}"
            lines.append(
                f"| {label}, {how} | {rate[plain]:,.0f} | {rate[exact]:,.0f} | "
                f"{ratio[exact]:.2f}x |"
            )
    cost = k["postgres_transaction"]
    lines += [
        "",
        f"One PostgreSQL transaction of {batch} INSERTs alone: {cost['plain_ms']:.2f} ms plain, "
        f"{cost['exactly_once_ms']:.2f} ms with the fenced position update.",
    ]
    return lines


def assignment_modes_table(m: dict[str, Any] | None) -> list[str]:
    """Range vs sticky: shards moved and time (bench_assignment.py)."""
    if not m:
        return []
    mv, sc = m["movement"], m["scale"]
    lines = [
        "",
        f"**Assignment modes**: shards moved when member {mv['members'] + 1} joins a "
        f"{mv['members']}-member group on {mv['shards']} shards, and when one of them leaves "
        f"(mean / max over {mv['trials']} sets of ids); and the whole group's assignment for "
        f"{sc['members']:,} members x {sc['shards']:,} shards (median of {sc['rounds']}).",
        "",
        "| mode | join: moved | leave: moved | 1 stream | 20 streams |",
        "|---|---:|---:|---:|---:|",
    ]
    for mode in ("range", "sticky"):
        row = mv[mode]
        lines.append(
            f"| `{mode}` | {row['join_mean']:.1f} / {row['join_max']} | "
            f"{row['leave_mean']:.1f} / {row['leave_max']} | "
            f"{sc[f'{mode}, 1 stream'] * 1000:.1f} ms | {sc[f'{mode}, 20 streams'] * 1000:.1f} ms |"
        )
    return lines


def plot(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4.2))
    labels = [
        f"{c['shards']} sh\n{'10 KB' if c['size'] >= 1024 else '100 B'}" for c in r["throughput"]
    ]
    xs = range(len(labels))
    left.bar(
        [x - 0.2 for x in xs],
        [c["plain_rate"] for c in r["throughput"]],
        0.4,
        label="plain aioboto3 loop",
    )
    left.bar(
        [x + 0.2 for x in xs],
        [c["kinesumer_rate"] for c in r["throughput"]],
        0.4,
        label="kinesumer",
    )
    left.set_xticks(list(xs), labels)
    left.set_ylabel("records/s")
    left.set_title("Throughput, one member")
    left.legend()
    members = [s["members"] for s in r["scaling"]]
    middle.bar(
        [str(m) for m in members], [s["records_per_s"] for s in r["scaling"]], color="tab:orange"
    )
    middle.axhline(
        r["scaling"][0]["plain_records_per_s"], color="grey", linestyle="--", label="one plain loop"
    )
    middle.set_xlabel("member processes")
    middle.set_ylabel("records/s")
    middle.set_title("Group scaling, 16 shards")
    middle.legend()
    sizes = [str(c["members"]) for c in r["cost"]]
    right.bar(
        [x - 0.2 for x in range(len(sizes))],
        [c["idle_capacity"] for c in r["cost"]],
        0.4,
        label="idle",
    )
    right.bar(
        [x + 0.2 for x in range(len(sizes))],
        [c["busy_capacity"] for c in r["cost"]],
        0.4,
        label="busy",
    )
    right.set_xticks(list(range(len(sizes))), sizes)
    right.set_xlabel("members in the group")
    right.set_ylabel("capacity units / member / minute")
    right.set_title("DynamoDB cost")
    right.legend()
    fig.suptitle(f"kinesumer benchmarks, {r['finished']} ({r['machine'].split(',')[0]})")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def splice(page: Path, begin: str, end: str, body: str) -> None:
    text = page.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{page} has no {begin} ... {end} section to replace")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    page.write_text(f"{head}{begin}\n{body}\n{end}{tail}")


def main(
    run_all: Callable[[bool], dict[str, Any]], results: Path, page: Path, begin: str, end: str
) -> None:
    parser = argparse.ArgumentParser(description="kinesumer benchmark suite")
    parser.add_argument("--quick", action="store_true", help="smaller data, fewer rounds")
    parser.add_argument(
        "--no-readme", action="store_true", help=f"do not update {page.name} (the site's page)"
    )
    parser.add_argument("--from-json", type=Path, help="re-render from a results.json")
    args = parser.parse_args()
    started = time.monotonic()
    r = json.loads(args.from_json.read_text()) if args.from_json else run_all(args.quick)
    results.mkdir(exist_ok=True)
    (results / "results.json").write_text(json.dumps(r, indent=2) + "\n")
    text = tables(r)
    (results / "results.md").write_text(text)
    plot(r, results / "summary.png")
    # The page's own copy of the plot: the site is built from docs/ only.
    image = page.parent / "img" / "benchmarks-summary.png"
    body = f"{text}\n![benchmarks](img/benchmarks-summary.png)\n"
    if not args.no_readme:
        image.parent.mkdir(exist_ok=True)
        shutil.copyfile(results / "summary.png", image)
        splice(page, begin, end, body)
    print()
    print(text)
    print(f"(suite: {(time.monotonic() - started) / 60:.1f} min; results in {results})")
