"""``Config(idle_poll_interval=...)``: the longest wait between reads of an idle shard (issue 23).

An empty read at the tip backs off from ``scan_interval``, doubling, up to ``idle_poll_interval``
(it was a fixed 1 s). The Spark source's option of the same name is the same concept: one option
string sets both the source's probe interval and the member's Config.
"""

from __future__ import annotations

import pytest

from kinesumer import Config, ConfigError
from kinesumer.read.fetcher import read_wait


def schedule(
    idle_poll_interval: float, reads: list[bool], scan_interval: float = 0.2
) -> list[float]:
    """The waits after each read (True: it found records)."""
    wait, out = scan_interval, []
    for found in reads:
        wait = read_wait(wait, found, scan_interval, idle_poll_interval)
        out.append(round(wait, 6))
    return out


def test_the_default_backs_off_to_one_second_as_before() -> None:
    assert Config(app="a", dynamodb_table="tbl").idle_poll_interval == 1.0
    assert schedule(1.0, [False] * 5) == [0.4, 0.8, 1.0, 1.0, 1.0]


def test_a_short_idle_poll_interval_bounds_the_wait() -> None:
    assert schedule(0.2, [False] * 4) == [0.2, 0.2, 0.2, 0.2]
    assert schedule(0.5, [False] * 3 + [True, False]) == [0.4, 0.5, 0.5, 0.2, 0.4]


def test_never_faster_than_scan_interval() -> None:
    """A scan_interval above idle_poll_interval wins: reads never come closer than it."""
    assert schedule(0.2, [False, True, False], scan_interval=0.5) == [0.5, 0.5, 0.5]


@pytest.mark.parametrize("value", [0.1, 0.0, "1", float("nan"), float("inf"), True])
def test_bad_idle_poll_interval_is_named(value: object) -> None:
    with pytest.raises(ConfigError, match="idle_poll_interval"):
        Config(app="a", dynamodb_table="tbl", idle_poll_interval=value)  # type: ignore[arg-type]


def test_the_spark_source_option_sets_the_member_config_too() -> None:
    from kinesumer.spark.source.options import parse_options, to_options

    parsed = parse_options(
        {
            "app": "orders",
            "dynamodb_table": "state-table",
            "streams": "a",
            "idle_poll_interval": "0.3",
        }
    )
    assert parsed.idle_poll_interval == 0.3
    assert parsed.config.idle_poll_interval == 0.3
    again = parse_options(to_options(parsed.config, ["a"]))
    assert again.idle_poll_interval == 0.3 == again.config.idle_poll_interval
