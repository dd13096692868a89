"""Reading state items back, typed: any app with access to the table can write any item, so
every attribute a decoder reads is checked, and a bad one is a :class:`CorruptStateError`
naming the item (its pk and sk) and what is wrong, never a bare ``KeyError`` from deep inside.
"""

from __future__ import annotations

from typing import Any

from ...errors import CorruptStateError
from ..schema import PARTITION_KEY, SORT_KEY

_REQUIRED: Any = object()


def corrupt(item: dict[str, Any], problem: str) -> CorruptStateError:
    """A :class:`CorruptStateError` naming ``item`` (its pk and sk) and what is wrong with it."""
    pk, sk = (str(item.get(k, {}).get("S", "?"))[:200] for k in (PARTITION_KEY, SORT_KEY))
    return CorruptStateError(f"state item pk={pk!r} sk={sk!r}: {problem}", pk=pk, sk=sk)


def attribute(item: dict[str, Any], name: str, kind: str, default: Any = _REQUIRED) -> Any:
    """Attribute ``name`` of ``item``, of DynamoDB type ``kind`` (``"N"`` read as an int);
    ``default`` when it is absent (without one it is required). :class:`CorruptStateError`
    naming the item when it is missing or of another type."""
    value = item.get(name)
    if value is None:
        if default is _REQUIRED:
            raise corrupt(item, f"attribute {name!r} is missing")
        return default
    return element(item, name, value, kind)


def element(item: dict[str, Any], name: str, value: Any, kind: str) -> Any:
    """A typed DynamoDB value (an attribute, or a member of a list or map attribute ``name``)
    as ``kind``; :class:`CorruptStateError` naming the item when it is another type."""
    python = {"S": str, "N": str, "BOOL": bool, "L": list, "M": dict, "B": bytes}[kind]
    if not isinstance(value, dict) or not isinstance(value.get(kind), python):
        raise corrupt(item, f"attribute {name!r} is not of type {kind}: {str(value)[:80]}")
    if kind != "N":
        return value[kind]
    try:
        return int(value["N"])
    except ValueError:
        raise corrupt(item, f"attribute {name!r} is not an integer: {value['N'][:80]!r}") from None
