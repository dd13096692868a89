"""The streams a command is given, as the state table keeps them: a Kinesis stream ARN of the
config's own account and region is kept under its plain name (its checkpoints are those of the
name), any other ARN under itself (:func:`kinesumer.accounts.state_key`, as the members do).
Commands look streams up by that key and print each as the user named it.

The home is the members' (``--role-arn``'s account, else the caller's; ``--kinesis-region``, else
``--region``). The caller's account is asked of STS (GetCallerIdentity, with ``--sts-endpoint``
when given) only when a Kinesis stream ARN is given without ``--role-arn``: a command given
names asks nothing."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Iterator, Mapping, Sequence

from ..accounts import state_key
from ..config import Config
from ..core.lag import GroupLag
from ..errors import ConfigError
from ..stream_refs import is_dynamodb_stream, parse_stream

__all__ = [
    "Names",
    "check_reachable",
    "lag_as_given",
    "state_names",
    "state_names_now",
]


class Names(Mapping[str, str]):
    """Each stream as given -> its state key (in the order given; one key given twice, as
    ``orders`` and its home ARN, is refused: it would be read or moved twice)."""

    def __init__(self, keys: dict[str, str]) -> None:
        self._keys = keys
        self._given = {key: given for given, key in keys.items()}

    def __getitem__(self, given: str) -> str:
        return self._keys[given]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def keys_list(self) -> list[str]:
        return list(self._keys.values())

    def given(self, key: str) -> str:
        """The stream as the user named it (a key nobody gave: itself)."""
        return self._given.get(key, key)


async def state_names(config: Config, streams: Sequence[str]) -> Names:
    """``streams`` (as given on the command line) with their state keys."""
    for stream in streams:
        parse_stream(stream)
    keys = {s: s for s in streams}
    if any(_kinesis_arn(s) for s in streams):
        from ..kinesis.places import config_home  # boto3 only when a stream ARN is met

        home = await config_home(config)
        keys = {s: state_key(s, home) for s in streams}
    seen: dict[str, str] = {}
    for given, key in keys.items():
        if key in seen:
            raise ConfigError(
                "stream",
                f"{seen[key]!r} and {given!r} are one stream (kept under {key!r}): give it once",
            )
        seen[key] = given
    return Names(keys)


def state_names_now(config: Config, streams: Sequence[str]) -> Names:
    """:func:`state_names` from a command not running an event loop."""
    return asyncio.run(state_names(config, streams))


def _kinesis_arn(stream: str) -> bool:
    return stream.startswith("arn:") and not is_dynamodb_stream(stream)


def lag_as_given(figure: GroupLag, names: Names) -> GroupLag:
    """``figure`` (probed by state keys) with each stream as the user named it."""
    rows = [dataclasses.replace(row, stream=names.given(row.stream)) for row in figure.shards]
    streams = [names.given(stream) for stream in figure.stream_names]
    return GroupLag.of(figure.app, figure.table, rows, streams)


async def check_reachable(config: Config, streams: Sequence[str]) -> Names:
    """:func:`state_names`, and each Kinesis stream ARN's account reached as a probe reaches
    it (its role assumed): for a command that would otherwise fail the same way at every
    probe (``lag --serve``). STS failing for now is no verdict: the probes retry."""
    names = await state_names(config, streams)
    arns = [parse_stream(s) for s in streams if _kinesis_arn(s)]
    if not arns:
        return names
    # boto3 only when a stream ARN is given.
    from ..errors import TransientAWSError
    from ..kinesis.tool_transport import open_tool_places

    async with contextlib.AsyncExitStack() as stack:
        _, places = await open_tool_places(stack, config)
        for ref in arns:
            assert ref.account is not None and ref.region is not None
            with contextlib.suppress(TransientAWSError):
                await places.transport(ref.account, ref.region)
    return names
