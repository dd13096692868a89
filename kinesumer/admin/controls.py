"""The operator's calls on the state table: creating it, for local work and tests (production
provisions it with Terraform from ``infra/``, and the consumer never needs create-table rights),
and the group's operator controls (pins, step-downs, forced rebalances); and deregistering the
app's enhanced fan-out consumer of a stream.

The controls are one item per app (:mod:`kinesumer.statestore.dynamodb.controls`), changed by a
read-modify-write conditional on the version read: a change that races another one is read
again and retried, never lost. Members read the item every ``max(10 s, heartbeat_interval)``, in
time slots aligned on the wall clock, so a control takes effect everywhere within about one slot
and one tick. Members of a version without controls ignore them: while one is live, the others
suspend pins and step-downs too (:mod:`kinesumer.group.controls`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NoReturn

from botocore.exceptions import ClientError

from ..accounts import Home, state_key
from ..aws import ClientFactory, error_code
from ..aws.clients import default_region
from ..config import Config
from ..core.controls import Controls, StepDown
from ..errors import (
    AccessDeniedError,
    ConfigError,
    StateStoreError,
    StateTableNotFoundError,
    StateTableSchemaError,
)
from ..kinesis.efo.consumers import deregister_stream_consumer
from ..kinesis.places import config_home, home_of
from ..statestore.dynamodb.controls import (
    controls_condition,
    controls_item,
    controls_key,
    decode_controls,
)
from ..statestore.schema import PARTITION_KEY, SORT_KEY, TTL_ATTRIBUTE
from ..stream_refs import is_dynamodb_stream, parse_stream

#: Read-modify-write attempts of a controls change racing other changes.
CONTROLS_ATTEMPTS = 10

#: Milliseconds past its end (by the writing host's clock) after which a step-down is dropped
#: from the controls item: far beyond any clock skew between operators' hosts.
STEP_DOWN_GC_MS = 3_600_000

log = logging.getLogger("kinesumer.admin")


def create_state_table(config: Config, *, wait: bool = True) -> bool:
    """Create ``config.dynamodb_table`` (on-demand, TTL on ``expires_at``) if it does not exist.

    Idempotent: an existing table with the right keys is left as it is and False is returned; an
    existing table with other keys raises :class:`StateTableSchemaError`.
    """
    client = ClientFactory(config).sync_dynamodb()
    name = config.dynamodb_table
    try:
        client.create_table(
            TableName=name,
            KeySchema=[
                {"AttributeName": PARTITION_KEY, "KeyType": "HASH"},
                {"AttributeName": SORT_KEY, "KeyType": "RANGE"},
            ],
            AttributeDefinitions=[
                {"AttributeName": PARTITION_KEY, "AttributeType": "S"},
                {"AttributeName": SORT_KEY, "AttributeType": "S"},
            ],
            BillingMode="PAY_PER_REQUEST",
        )
        created = True
    except ClientError as exc:
        code = error_code(exc)
        if code == "AccessDeniedException":
            raise AccessDeniedError(f"AWS denied dynamodb:CreateTable on {name!r}: {exc}") from exc
        if code != "ResourceInUseException":
            raise
        created = False
    if wait:
        client.get_waiter("table_exists").wait(
            TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60}
        )
    table = client.describe_table(TableName=name)["Table"]
    keys = {k["AttributeName"]: k["KeyType"] for k in table["KeySchema"]}
    if keys != {PARTITION_KEY: "HASH", SORT_KEY: "RANGE"}:
        raise StateTableSchemaError(
            f"table {name!r} exists with keys {keys}; kinesumer needs {PARTITION_KEY} (HASH) and "
            f"{SORT_KEY} (RANGE): pick another dynamodb_table"
        )
    if created:
        try:
            client.update_time_to_live(
                TableName=name,
                TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE},
            )
        except ClientError as exc:  # dynalite has no TTL API; the table works without it
            log.info("could not enable TTL on %s (%s); dead client items stay", name, exc)
        log.info("created state table %s", name)
    return created


# -- operator controls ------------------------------------------------------------------------
def read_controls(config: Config) -> Controls:
    """The app's controls as stored (strongly consistent); version 0 when none were set."""
    client = ClientFactory(config).sync_dynamodb()
    item = _call(
        config,
        "GetItem",
        lambda: client.get_item(
            TableName=config.dynamodb_table, Key=controls_key(config.app), ConsistentRead=True
        ),
    )
    return decode_controls(item.get("Item"))


def update_controls(config: Config, change: Callable[[Controls], Controls]) -> Controls:
    """Apply ``change`` to the stored controls and write the result, conditional on the version
    read; a refused condition (another change landed in between) reads again and retries.
    Returns the controls as written. Raises :class:`StateStoreError` after
    ``CONTROLS_ATTEMPTS`` refusals in a row."""
    client = ClientFactory(config).sync_dynamodb()
    for _ in range(CONTROLS_ATTEMPTS):
        current = read_controls(config)
        wanted = change(current)
        try:
            client.put_item(
                TableName=config.dynamodb_table,
                Item=controls_item(config.app, wanted),
                **controls_condition(current.version),
            )
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                log.info("controls of %s changed meanwhile; reading them again", config.app)
                continue
            _raise_named(config, "PutItem", exc)
        return replace(wanted, version=current.version + 1)
    raise StateStoreError(
        f"the controls of app {config.app!r} kept changing under {CONTROLS_ATTEMPTS} attempts"
    )


def pin_shard(config: Config, stream: str, shard_id: str, client_id: str) -> Controls:
    """Pin ``stream``/``shard_id`` to member ``client_id``: it leaves the automatic assignment
    and that member reads it while it is live and consumes ``stream``; otherwise the pin falls
    back to the automatic assignment (the members log it) until the member is back.

    ``stream`` as the members are given it: a name, a Kinesis stream ARN (of any account and
    region) or a table's stream ARN. The pin is kept as given and members match it by its state
    key, so ``orders`` and its home ARN are one stream: this pin replaces one of the shard made
    under the other spelling (else two pins of one shard to two members). The home is
    ``config``'s: give it the members' ``role_arn`` and ``kinesis_region``."""
    parse_stream(stream)
    for name, value in (("shard_id", shard_id), ("client_id", client_id)):
        if not isinstance(value, str) or not value or "/" in value:
            raise ConfigError(name, f"must be a non-empty name without '/', got {value!r}")
    same = _same_shard(config, stream, shard_id)

    def pin(c: Controls) -> Controls:
        kept = {k: v for k, v in c.pins.items() if not same(k)}
        return replace(c, pins={**kept, (stream, shard_id): client_id})

    return update_controls(config, pin)


def unpin_shard(config: Config, stream: str, shard_id: str) -> Controls:
    """Remove the pin of ``stream``/``shard_id``, made under this spelling of the stream or
    another one of its state key (its name or its home ARN); none: nothing changes but the
    version."""
    parse_stream(stream)
    same = _same_shard(config, stream, shard_id)
    return update_controls(
        config, lambda c: replace(c, pins={k: v for k, v in c.pins.items() if not same(k)})
    )


def _same_shard(config: Config, stream: str, shard_id: str) -> Callable[[tuple[str, str]], bool]:
    """Whether a pin's (stream, shard) is ``stream``'s ``shard_id`` by state key
    (:func:`kinesumer.accounts.state_key`), with ``config``'s home: its ``role_arn``'s account
    and Kinesis region, as the members have them (without ``role_arn``, the caller's account,
    asked of STS once, at the first Kinesis stream ARN compared: names alone ask nothing)."""
    home: list[Home] = []

    def key(text: str) -> str:
        if not text.startswith("arn:") or is_dynamodb_stream(text):
            return text
        if not home:
            home.append(_home_now(config))
        return state_key(text, home[0])

    def same(pin: tuple[str, str]) -> bool:
        pinned, pinned_shard = pin
        return pinned_shard == shard_id and (pinned == stream or key(pinned) == key(stream))

    return same


def _home_now(config: Config) -> Home:
    """``config``'s home, asking STS only when its account is unknown; from a thread of its
    own when the caller runs an event loop (these calls block, as boto3's do, but may be made
    from a coroutine or a notebook cell)."""
    home = home_of(config)
    if home.account is not None and home.region is not None:
        return home
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(config_home(config))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(config_home(config))).result()


def list_pins(config: Config) -> dict[tuple[str, str], str]:
    """Every pin: (stream, shard id) -> client id."""
    return dict(sorted(read_controls(config).pins.items()))


def step_down(config: Config, client_id: str, seconds: float, *, drain: bool = False) -> Controls:
    """Make member ``client_id`` step down for ``seconds``: it does not lead (the next live id
    does), and with ``drain`` it also gives up its automatically assigned shards (not those
    pinned to it). It keeps heartbeating. ``seconds=0`` cancels a step-down."""
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not 0 <= seconds < float("inf")
    ):
        raise ConfigError("seconds", f"must be a finite number of seconds >= 0, got {seconds!r}")
    until = int(time.time() * 1000 + seconds * 1000)

    def change(c: Controls) -> Controls:
        # Others' step-downs are dropped only long past their end by this host's clock, so
        # that a clock behind the one that wrote them never cuts one short (members judge
        # each by its length, on their own clocks: core/controls.py).
        gone = int(time.time() * 1000) - STEP_DOWN_GC_MS
        steps = {k: s for k, s in c.step_downs.items() if s.active(gone) and k != client_id}
        if seconds > 0:
            steps[client_id] = StepDown(until, drain, int(seconds * 1000))
        return replace(c, step_downs=steps)

    return update_controls(config, change)


def force_rebalance(config: Config) -> Controls:
    """Make every member assign afresh: re-read the members, owners and shard lists, drop
    pending claims, and in ``sticky`` mode lay the shards out as if nobody owned any."""
    return update_controls(config, lambda c: replace(c, rebalance=c.rebalance + 1))


# -- the app's enhanced fan-out consumer ------------------------------------------------------
def deregister_consumer(config: Config, stream: str) -> bool:
    """Deregister the app's enhanced fan-out consumer of ``stream`` (a name, or a Kinesis stream
    ARN: in its own account and region); blocking. From a coroutine:
    :func:`deregister_stream_consumer` (which says what it raises)."""
    return asyncio.run(deregister_stream_consumer(config, stream))


def _call(config: Config, operation: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except ClientError as exc:
        _raise_named(config, operation, exc)


def _raise_named(config: Config, operation: str, exc: ClientError) -> NoReturn:
    code = error_code(exc)
    name = config.dynamodb_table
    if code == "ResourceNotFoundException":
        region = config.effective_dynamodb_region or default_region() or "the default region"
        where = f"{region} at {config.dynamodb_endpoint}" if config.dynamodb_endpoint else region
        raise StateTableNotFoundError(f"DynamoDB table {name!r} does not exist in {where}") from exc
    if code == "AccessDeniedException":
        raise AccessDeniedError(f"AWS denied dynamodb:{operation} on {name!r}: {exc}") from exc
    raise StateStoreError(f"dynamodb:{operation} on {name!r} failed: {exc}") from exc
