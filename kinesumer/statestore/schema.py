"""Names in the DynamoDB state table that the library, Terraform (``infra/``) and the tests share.

One table serves any number of apps; every item is keyed by ``pk`` (hash) and ``sk`` (range),
both strings. ``expires_at`` (epoch seconds) is the TTL attribute: client items carry it so that
DynamoDB removes members that vanished without deregistering.
"""

from __future__ import annotations

PARTITION_KEY = "pk"
SORT_KEY = "sk"
TTL_ATTRIBUTE = "expires_at"


def client_pk(app: str) -> str:
    return f"client#{app}"


def shard_cache_pk(app: str) -> str:
    return f"shard_cache#{app}"


def checkpoint_pk(app: str, stream: str) -> str:
    return f"check_point#{app}#{stream}"
