"""The join's check that a stream given by ARN does not silently leave checkpoints behind:
an application that read a stream by name through ``role_arn`` (its account then home, the
stream kept under its plain name) and now gives its ARN with the role in ``Config.accounts``
(another account's ARN: kept under the ARN) would read it afresh. State keys never change
(old and new members share the table), so such a join is refused, naming both keys."""

from __future__ import annotations

from collections.abc import Iterable

from ..accounts import Home, state_key
from ..errors import ConfigError
from ..models import Checkpoint, ClientInfo
from ..statestore.base import StateStore
from ..stream_refs import parse_stream

__all__ = ["check_checkpoints_kept"]


def holds_a_position(checkpoint: Checkpoint) -> bool:
    """Whether a checkpoint item says where its shard's reading is: a record processed, the
    shard finished, or where a LATEST read of it began."""
    return (
        checkpoint.sequence_number is not None
        or checkpoint.finished
        or checkpoint.started_at_ms is not None
    )


async def check_checkpoints_kept(
    store: StateStore, added: Iterable[str], streams: Iterable[str], home: Home, where: str
) -> None:
    """Refuse (:class:`ConfigError` naming the stream, both keys and the ways on) a Kinesis
    stream ARN kept under its ARN, with no position there yet, while its plain name (which no
    stream of ``streams`` is kept under) holds positions: the checkpoints of an application
    that read it by name through ``role_arn`` (whose account was then home) and now names it
    by ARN without ``role_arn``. Starting would read it afresh at the initial position
    (records skipped at LATEST, read twice at TRIM_HORIZON) and, in a rolling upgrade, beside
    the old members reading the same shards under the other items. The keys themselves never
    change: members of the old and the new configuration share the table. Not refused when
    every member whose client item (live or not yet expired) names the plain name says its
    home is another account or region: then the two are streams of one name read side by
    side. A member of an older version says nothing of its home, so it counts as a possible
    reader of this very stream. Two strongly consistent queries per such stream (and a read
    of the client items before a refusal), at the join or refresh that adds it; none for
    names and home ARNs."""
    keys = {state_key(text, home) for text in streams}
    clients: list[ClientInfo] | None = None  # read only when a refusal nears
    for text in added:
        if not text.startswith("arn:") or ":kinesis:" not in text:
            continue
        ref = parse_stream(text)
        if ref.kind != "kinesis-arn" or state_key(text, home) != text or ref.name in keys:
            continue
        if any(holds_a_position(c) for c in (await store.get_checkpoints(text)).values()):
            continue
        kept = await store.get_checkpoints(ref.name)
        if not any(holds_a_position(c) for c in kept.values()):
            continue
        if clients is None:
            clients = await store.list_clients()
        readers = [c for c in clients if ref.name in {state_key(s, home) for s in c.streams}]
        if readers and all(reads_elsewhere(c, ref.account, ref.region, home) for c in readers):
            # Every member that reads (or read) the plain name says its home is another place:
            # two streams of one name side by side in one group, not a stream that changed keys.
            continue
        raise ConfigError(
            "streams",
            f"{text!r} has no checkpoint under its ARN, the key it is kept under (not the "
            f"home account and region), but {len(kept)} shard(s) have checkpoints under the "
            f"plain name {ref.name!r}; starting would read it afresh at initial_position. If "
            f"they are this stream's (read by name through a role of account {ref.account}), "
            f"keep them: make that account home again, Config(role_arn='arn:aws:iam::"
            f"{ref.account}:role/<its role>', kinesis_region={ref.region!r}), and an ARN of "
            f"it is kept under its plain name (other accounts go in Config.accounts). If "
            f"{ref.name!r} is another stream, start {text!r} under its own key and keep "
            f"{ref.name!r}'s: kinesumer checkpoints rewind --stream {text} --to trim-horizon "
            f"(or --to latest, or --to-time), with --account for its account",
            where,
        )


def reads_elsewhere(
    client: ClientInfo, account: str | None, region: str | None, home: Home
) -> bool:
    """Whether ``client``'s item says its home (where its names live) is not ``account`` and
    ``region``. An older version's item says nothing: it may be that very stream, read by name
    through a ``role_arn`` of its account. A member that never needed its account (names only,
    no ``role_arn``) acts in the caller's account, taken to be ``home``'s, as a group's members
    share their credentials."""
    if not client.home:
        return False
    its_account, _, its_region = client.home.partition(":")
    return (its_account or home.account, its_region or home.region) != (account, region)
