"""Records/s of one member reading three streams in two accounts and two regions, against one
stream in its home account and region; its AWS clients per (account, region) and its memory.

    .venv/bin/python benchmarks/bench_streams_by_arn.py [--records 30000] [--rounds 3] [--quick]

Also run by ``./scripts/bench`` (``benchmarks/run.py``). On moto in server mode (the only
stand-in that keeps accounts and regions apart and assumes roles), in a process of its own on a
free loopback port (stopped by pid), reset before every reader. The same number of records of
~100 B, the same number of shards (6) and so the same records per shard (moto's GetRecords
slows as a shard grows: equal shards keep that out of the ratio) go either

- **one**: into one 6-shard stream ``orders`` in the home place (account A, us-east-1), read by
  name; or
- **three**: a third into each of three 2-shard streams ``orders``: A's us-east-1 (by name), A's
  eu-west-1 (by ARN) and account B's us-east-1 (by ARN, through a role of B assumed with moto's
  STS: ``Config.accounts``, ``sts_endpoint``).

Each reader is a fresh process (so its memory is its own): one ``Kinesumer`` member consuming
the stream(s) from TRIM_HORIZON to the last record. Reported per reader: records/s from the
first record to the last (the join is reported apart), the AWS clients it opened (counted by
wrapping :class:`kinesumer.aws.clients.ClientFactory`: the home Kinesis client, one regional
Kinesis client per other (account, region), the credential sessions, the DynamoDB clients), the
TCP connections it held to the server at the end of the read, its GetRecords calls, and its RSS
before the consumer was made and after the read. Rounds alternate the two; medians and the ratio are
from the same run. moto's speed bounds both: a comparison of overheads, not a figure for AWS.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import boto3

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

A = "123456789012"  # moto's account for plain keys: the caller's
B = "111111111111"
ROLE_B = f"arn:aws:iam::{B}:role/orders-reader"
NAME = "orders"
SHARDS = 6
HOME = "us-east-1"

#: The moto server process: the session stand-in, in a process of its own (the reader's memory
#: and CPU are then the reader's only); it prints its URL and serves until its stdin closes.
SERVER = """
import sys
sys.path.insert(0, sys.argv[1])
from support.standins import start_moto
server = start_moto()
print(server.url, flush=True)
sys.stdin.read()
server.stop()
"""


def arn(region: str, account: str) -> str:
    return f"arn:aws:kinesis:{region}:{account}:stream/{NAME}"


# --- the reader process ---------------------------------------------------------------------


def rss_mb() -> float:
    status = Path("/proc/self/status").read_text()
    return int(next(x for x in status.splitlines() if x.startswith("VmRSS")).split()[1]) / 1024


def connections_to(port: int) -> int:
    """This process's established TCP connections to ``port`` on the loopback."""
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                parts = line.split()
                remote_port = int(parts[2].rsplit(":", 1)[1], 16)
                if remote_port == port and parts[3] == "01" and parts[9] in inodes:
                    found += 1
    return found


def count_clients() -> Counter[str]:
    """Wrap the client factory: every client and credential session a member makes, counted."""
    from kinesumer.aws import clients

    made: Counter[str] = Counter()
    factory = clients.ClientFactory
    aws = clients.AwsClients
    home_kinesis, dynamodb, regional = factory.kinesis, factory.dynamodb, factory.regional_kinesis
    account_session, sync_dynamodb = factory.account_session, factory.sync_dynamodb
    per_place = aws.regional_kinesis
    place: dict[str, str] = {}

    def counted_home(self: Any) -> Any:
        made[f"kinesis {A} {HOME} (home client)"] += 1
        return home_kinesis(self)

    def counted_dynamodb(self: Any, **kw: Any) -> Any:
        made["dynamodb (async)"] += 1
        return dynamodb(self, **kw)

    def counted_sync_dynamodb(self: Any, **kw: Any) -> Any:
        made["dynamodb (blocking, heartbeat thread)"] += 1
        return sync_dynamodb(self, **kw)

    def counted_session(self: Any, role: Any) -> Any:
        made[f"credential session {'role ' + role[0] if role else 'own'}"] += 1
        return account_session(self, role)

    async def counted_place(self: Any, account: str, region: str, role: Any) -> Any:
        place["now"] = f"{account} {region}"
        return await per_place(self, account, region, role)

    def counted_regional(self: Any, session: Any, region: str) -> Any:
        made[f"kinesis {place.get('now', '?')} (regional client)"] += 1
        return regional(self, session, region)

    factory.kinesis = counted_home  # type: ignore[method-assign]
    factory.dynamodb = counted_dynamodb  # type: ignore[method-assign]
    factory.sync_dynamodb = counted_sync_dynamodb  # type: ignore[method-assign]
    factory.account_session = counted_session  # type: ignore[method-assign]
    factory.regional_kinesis = counted_regional  # type: ignore[method-assign]
    aws.regional_kinesis = counted_place  # type: ignore[method-assign]
    return made


def reader(url: str, streams: list[str], total: int, app: str) -> dict[str, Any]:
    """One member reading ``streams`` to the ``total``-th record (run in its own process)."""
    from kinesumer import AccountAccess, Config, Kinesumer

    made = count_clients()
    config = Config(
        app=app,
        dynamodb_table="bench-state",
        region=HOME,
        kinesis_endpoint=url,
        dynamodb_endpoint=url,
        sts_endpoint=url,
        accounts={B: AccountAccess(role_arn=ROLE_B)},
        initial_position="TRIM_HORIZON",
    )
    port = int(url.rsplit(":", 1)[1])
    before = rss_mb()
    started = time.perf_counter()
    first = 0.0
    seen = 0
    by_stream: Counter[str] = Counter()
    with Kinesumer(config) as consumer:
        for record in consumer.consume(streams):
            seen += 1
            by_stream[record.stream] += 1
            if seen == 1:
                first = time.perf_counter()
            if seen == total:
                break
        ended = time.perf_counter()
        after = rss_mb()
        connections = connections_to(port)
        requests = consumer.stats().requests
    return {
        "records_per_s": (total - 1) / (ended - first),
        "join_s": first - started,
        "with_join_records_per_s": total / (ended - started),
        "rss_before_mb": before,
        "rss_after_mb": after,
        "clients": dict(made),
        "connections": connections,
        "get_records": sum(v for k, v in requests.items() if k.endswith("GetRecords")),
        "by_stream": dict(by_stream),
    }


# --- the orchestration ----------------------------------------------------------------------


class MotoProcess:
    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(ROOT / "tests")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        self.url = self.process.stdout.readline().strip()
        if not self.url.startswith("http://127.0.0.1:"):
            self.stop()
            raise RuntimeError(f"moto's server process did not start (said {self.url!r})")

    def reset(self) -> None:
        request = urllib.request.Request(f"{self.url}/moto-api/reset", data=b"", method="POST")
        with urllib.request.urlopen(request, timeout=60) as answer:
            assert answer.status == 200

    def stop(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)


def kinesis_of(url: str, region: str, account: str) -> Any:
    if account == A:
        return boto3.client("kinesis", endpoint_url=url, region_name=region)
    sts = boto3.client("sts", endpoint_url=url, region_name=region)
    creds = sts.assume_role(RoleArn=ROLE_B, RoleSessionName="bench-setup")["Credentials"]
    return boto3.client(
        "kinesis",
        endpoint_url=url,
        region_name=region,
        aws_access_key_id=creds["AccessKeyId"],
        aws_secret_access_key=creds["SecretAccessKey"],
        aws_session_token=creds["SessionToken"],
    )


def fill(client: Any, shards: int, records: int) -> None:
    client.create_stream(StreamName=NAME, ShardCount=shards)
    client.get_waiter("stream_exists").wait(StreamName=NAME, WaiterConfig={"Delay": 0.1})
    payload = b"x" * 100
    for start in range(0, records, 500):
        batch = [
            {"Data": payload, "PartitionKey": f"k{n}"}
            for n in range(start, min(records, start + 500))
        ]
        answer = client.put_records(StreamName=NAME, Records=batch)
        assert not answer.get("FailedRecordCount"), answer


def setup(url: str, variant: str, records: int) -> list[str]:
    """The streams of ``variant``, filled; what the member is given to read."""
    from kinesumer import Config, create_state_table

    create_state_table(
        Config(app="bench", dynamodb_table="bench-state", region=HOME, dynamodb_endpoint=url)
    )
    if variant == "one":
        fill(kinesis_of(url, HOME, A), SHARDS, records)
        return [NAME]
    places = ((HOME, A), ("eu-west-1", A), (HOME, B))
    for region, account in places:
        fill(kinesis_of(url, region, account), SHARDS // 3, records // 3)
    return [NAME, arn("eu-west-1", A), arn(HOME, B)]


def one_reader(url: str, streams: list[str], records: int, app: str) -> dict[str, Any]:
    command = [sys.executable, __file__, "--reader", url, "--app", app, "--records", str(records)]
    answer = subprocess.run(
        [*command, *streams], check=True, stdout=subprocess.PIPE, text=True, timeout=900
    )
    result: dict[str, Any] = json.loads(answer.stdout.strip().splitlines()[-1])
    return result


def run(records: int, rounds: int) -> dict[str, Any]:
    records -= records % 3
    moto = MotoProcess()
    runs: dict[str, list[dict[str, Any]]] = {"one": [], "three": []}
    try:
        for number in range(rounds):
            for variant in ("one", "three") if number % 2 == 0 else ("three", "one"):
                moto.reset()
                streams = setup(moto.url, variant, records)
                result = one_reader(moto.url, streams, records, f"bench-{variant}-{number}")
                runs[variant].append(result)
                print(
                    f"  streams by ARN, round {number + 1}, {variant}: "
                    f"{result['records_per_s']:,.0f} records/s",
                    flush=True,
                )
    finally:
        moto.stop()
    return {"records": records, "rounds": rounds, "runs": runs}


def median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def rates(runs: list[dict[str, Any]]) -> str:
    return ", ".join(f"{r['records_per_s']:,.0f}" for r in runs)


def report(result: dict[str, Any]) -> str:
    one, three = result["runs"]["one"], result["runs"]["three"]
    rate_one, rate_three = median(one, "records_per_s"), median(three, "records_per_s")
    lines = [
        f"Streams by ARN on moto server, {result['records']:,} records of 100 B over 6 shards, "
        f"one member, median of {result['rounds']} alternating rounds:",
        f"  one stream (A us-east-1, by name, 6 shards):         {rate_one:10,.0f} records/s",
        f"  three streams (A us-east-1 + A eu-west-1 + B us-east-1 through a role, 2 shards "
        f"each): {rate_three:10,.0f} records/s",
        f"  ratio three / one:                                  {rate_three / rate_one:10.2f}",
        f"  rounds, one:   {rates(one)}",
        f"  rounds, three: {rates(three)}",
        f"  join (to the first record), one / three:            "
        f"{median(one, 'join_s'):.1f} s / {median(three, 'join_s'):.1f} s",
        f"  RSS before -> after the read, one:   {median(one, 'rss_before_mb'):.0f} -> "
        f"{median(one, 'rss_after_mb'):.0f} MB",
        f"  RSS before -> after the read, three: {median(three, 'rss_before_mb'):.0f} -> "
        f"{median(three, 'rss_after_mb'):.0f} MB",
        f"  TCP connections to the server at the end, one / three: "
        f"{median(one, 'connections'):.0f} / {median(three, 'connections'):.0f}",
        f"  GetRecords calls, one / three: {median(one, 'get_records'):.0f} / "
        f"{median(three, 'get_records'):.0f}",
        "  AWS clients and credential sessions made by the member:",
    ]
    for name, runs in (("one", one), ("three", three)):
        for client, count in sorted(runs[-1]["clients"].items()):
            lines.append(f"    {name:5} {client}: {count}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="12,000 records, 2 rounds")
    parser.add_argument("--reader", help=argparse.SUPPRESS)  # the reader process: moto's URL
    parser.add_argument("--app", help=argparse.SUPPRESS)
    parser.add_argument("streams", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.reader:
        print(json.dumps(reader(args.reader, args.streams, args.records, args.app)))
        return
    records, rounds = (12_000, 2) if args.quick else (args.records, args.rounds)
    result = run(records, rounds)
    print(report(result))
    if args.quick or args.records != 30_000 or args.rounds != 3:
        print(f"  (command: {' '.join(sys.argv)})")


if __name__ == "__main__":
    main()
