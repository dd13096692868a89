"""Names in the DynamoDB state table that the library, Terraform (``infra/``) and the tests share.

One table serves any number of apps; every item is keyed by ``pk`` (hash) and ``sk`` (range),
both strings. ``expires_at`` (epoch seconds) is the TTL attribute: client items carry it so that
DynamoDB removes members that vanished without deregistering.
"""

from __future__ import annotations

from typing import Any

PARTITION_KEY = "pk"
SORT_KEY = "sk"
TTL_ATTRIBUTE = "expires_at"


def client_pk(app: str) -> str:
    return f"client#{app}"


def shard_cache_pk(app: str) -> str:
    return f"shard_cache#{app}"


def checkpoint_pk(app: str, stream: str) -> str:
    return f"check_point#{app}#{stream}"


def spark_latest_pk(app: str) -> str:
    """The Spark source's ``LATEST`` pins of ``app``
    (:mod:`kinesumer.spark.source.driver.pins`), one
    per shard at ``sk=<stream>#<shard id>``."""
    return f"spark_latest#{app}"


def item_size(item: dict[str, Any]) -> int:
    """An item's size as DynamoDB bills and limits it (400 KB), from its attribute values:
    names and values in UTF-8 bytes, numbers at most 21 bytes, 3 bytes per map or list plus
    one per element. Slightly over rather than under."""
    return sum(len(name.encode()) + value_size(value) for name, value in item.items())


def value_size(value: dict[str, Any]) -> int:
    ((kind, inner),) = value.items()
    if kind == "S":
        return len(inner.encode())
    if kind == "B":
        return len(inner)
    if kind == "N":
        return min(21, len(inner.lstrip("-").replace(".", "")) // 2 + 2)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "M":
        return 3 + sum(len(k.encode()) + value_size(v) + 1 for k, v in inner.items())
    if kind == "L":
        return 3 + sum(value_size(v) + 1 for v in inner)
    if kind in ("SS", "NS", "BS"):
        return sum(value_size({kind[0]: v}) for v in inner)
    raise ValueError(f"unknown DynamoDB attribute type {kind!r}")
