"""Creating the state table, for local work and tests (production provisions it with Terraform
from ``infra/``, and the consumer never needs create-table rights)."""

from __future__ import annotations

import logging

from botocore.exceptions import ClientError

from .aws import ClientFactory, error_code
from .config import Config
from .errors import AccessDeniedError, StateTableSchemaError
from .statestore.schema import PARTITION_KEY, SORT_KEY, TTL_ATTRIBUTE

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
