"""``kinesumer produce STREAM``: stdin lines to records, a summary, exit 1 when a line was not
written (the CLI test style of ``test_cli.py``: ``cli.main`` in process, stdin replaced)."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable

import pytest
from _group import create_stream
from _produced import by_key, read_all
from _standins import NodeStandIn

from kinesumer import cli


def run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], stdin: bytes, *argv: str
) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_produce_puts_json_lines_keyed_by_a_field_in_order(
    kinesalite: NodeStandIn,
    unique_name: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stream = unique_name("cli")
    create_stream(kinesalite.url, stream, 2)
    lines = [json.dumps({"user": f"u{i % 7}", "n": i}) for i in range(300)]
    stdin = ("\n".join(lines) + "\n").encode()
    where = ["--region", "us-east-1", "--kinesis-endpoint", kinesalite.url]
    code, _, err = run(monkeypatch, capsys, stdin, "produce", stream, *where, "--key-field", "user")
    assert code == 0, err
    assert "300 line(s) written" in err
    records = read_all(kinesalite.url, stream)
    assert sorted(r.data for r in records) == sorted(line.encode() for line in lines)
    for key, datas in by_key(records).items():
        numbers = [json.loads(d)["n"] for d in datas]
        assert numbers == sorted(numbers) and all(n % 7 == int(key[1:]) for n in numbers)


def test_produce_exits_1_and_counts_what_was_not_written(
    kinesalite: NodeStandIn,
    unique_name: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stream = unique_name("cli")
    create_stream(kinesalite.url, stream, 1)
    where = ["--region", "us-east-1", "--kinesis-endpoint", kinesalite.url]
    stdin = b'{"id": 1}\nnot json\n{"other": 2}\n{"id": "x"}\n'
    code, _, err = run(monkeypatch, capsys, stdin, "produce", stream, *where, "--key-field", "id")
    assert code == 1
    assert "line 2 not written: not a JSON line" in err
    assert "line 3 not written: no field 'id'" in err
    assert "2 line(s) written" in err and "2 NOT written (KinesumerError: 2)" in err
    assert sorted(r.partition_key for r in read_all(kinesalite.url, stream)) == ["1", "x"]

    missing = unique_name("missing")
    code, _, err = run(monkeypatch, capsys, b"a\nb\n", "produce", missing, *where)
    assert code == 1
    assert "does not exist" in err and "2 NOT written (StreamNotFoundError: 2)" in err
