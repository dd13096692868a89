"""Checks on the Terraform in ``infra/``.

Three layers, cheapest first:

- parsed HCL (python-hcl2, always runs): the state table matches ``kinesumer.statestore.schema``
  and the IAM documents grant the kinesumer calls only, on named resources only;
- the table created from that parsed definition in moto has the schema the library expects;
- terraform itself (skipped without terraform or the offline provider folder): ``fmt``,
  ``validate`` of every module and the example, a ``plan`` with dummy credentials that renders the
  real policy JSON and the planned table, and a plan with bad inputs that the variables' validations
  must reject. Terraform runs on a temporary copy of ``infra/`` so the work tree stays clean.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws
from support.aws_calls import library_calls
from support.tfschema import (
    INFRA_DIR,
    REPO_ROOT,
    STATE_TABLE_DIR,
    TerraformParseError,
    create_table_from_terraform,
    load_module,
    module_variables,
    policy_statements,
    schema_mismatches,
    table_definition,
)

from kinesumer.statestore.schema import PARTITION_KEY, SORT_KEY, TTL_ATTRIBUTE

# Terraform: init, validate and plan of every module, each a process of its own.
pytestmark = pytest.mark.slow

MODULES_DIR = INFRA_DIR / "modules"
CONSUMER_POLICY_DIR = MODULES_DIR / "consumer-policy"
CROSS_ACCOUNT_ROLE_DIR = MODULES_DIR / "cross-account-role"
TERRAFORM_DIRS = [
    "modules/state-table",
    "modules/consumer-policy",
    "modules/cross-account-role",
    "modules/producer-policy",
    "examples/basic",
    "examples/multi-account",
]

# The calls kinesumer makes, and nothing else (infra/README.md explains each grant).
KINESIS_READ_ACTIONS = {
    "kinesis:DescribeStreamSummary",
    "kinesis:ListShards",
    "kinesis:GetShardIterator",
    "kinesis:GetRecords",
}
#: Item calls, granted only on the app's own keys (dynamodb:LeadingKeys), and the one table call.
DYNAMODB_ITEM_ACTIONS = {
    "dynamodb:GetItem",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
    "dynamodb:Query",
    "dynamodb:BatchGetItem",
    "dynamodb:BatchWriteItem",
}
DYNAMODB_ACTIONS = DYNAMODB_ITEM_ACTIONS | {"dynamodb:DescribeTable"}
#: What kinesumer calls on a DynamoDB table's stream (kinesis/dynamodb_streams.py), on the stream
#: ARNs given (table_stream_arns) only; ListStreams (resource "*") is never called.
TABLE_STREAM_READ_ACTIONS = {
    "dynamodb:DescribeStream",
    "dynamodb:GetShardIterator",
    "dynamodb:GetRecords",
}
# Stream administration must never be granted, enhanced fan-out only with enhanced_fan_out =
# true (EFO_REGISTER on the streams, EFO_SUBSCRIBE on the consumer ARNs); writes only on the
# dead-letter streams (DEAD_LETTER_WRITE).
EFO_REGISTER = {"kinesis:RegisterStreamConsumer"}
EFO_SUBSCRIBE = {"kinesis:DescribeStreamConsumer", "kinesis:SubscribeToShard"}
EFO_SIDS = {"KinesisEnhancedFanOutRegister", "KinesisEnhancedFanOutSubscribe"}
#: The parsed resources of the subscribe statement: each stream's consumer, any creation time.
EFO_CONSUMER_RESOURCES = {
    "consumer-policy": (
        '${sort([for arn in distinct(var.stream_arns) : "${arn}/consumer/${var.consumer_name}:*"])}'
    ),
    "cross-account-role": (
        '${sort([for arn in local.stream_arns : "${arn}/consumer/${var.consumer_name}:*"])}'
    ),
}
#: The parsed streams the cross-account role reads: the ARNs given, and the names given per region
#: made into ARNs of the role's own account (data.aws_caller_identity, read only for names).
ROLE_STREAM_ARNS = (
    "${sort(distinct(concat(var.stream_arns, flatten([for region, names in var.stream_names : "
    '[for name in names : "arn:${data.aws_partition.current.partition}:kinesis:${region}:'
    '${data.aws_caller_identity.current[0].account_id}:stream/${name}"]]))))}'
)
#: The per-key statements of stream_kms_keys: one key, its region's Kinesis, its streams.
STREAM_KEY_STATEMENT = {
    "sid": "${statement.value.sid}",
    "effect": "Allow",
    "actions": ["kms:Decrypt"],
    "resources": ["${statement.key}"],
    "condition": [
        {
            "test": "StringEquals",
            "variable": "kms:ViaService",
            "values": ["kinesis.${statement.value.region}.amazonaws.com"],
        },
        {
            "test": "StringEquals",
            "variable": "kms:EncryptionContext:aws:kinesis:arn",
            "values": "${statement.value.streams}",
        },
    ],
}
#: Called by `kinesumer deregister-consumer` (an operator's command), never granted to members.
OPERATOR_ONLY = {"kinesis:DeregisterStreamConsumer"}
#: Called by the lag service (`kinesumer lag --serve --cloudwatch-namespace`), never by a member:
#: not in the consumer policy; infra/README.md gives the statement for the service's role.
LAG_SERVICE_ONLY = {"cloudwatch:PutMetricData"}
#: Asked once for the caller's account when a stream is given by ARN and no role_arn says it.
#: AWS needs no permission for it ("No permissions are required to perform this operation";
#: an explicit deny cannot refuse it either): no policy grants it.
NEEDS_NO_PERMISSION = {"sts:GetCallerIdentity"}
FORBIDDEN_KINESIS_ACTIONS = {
    "kinesis:DescribeStream",  # never called (DescribeStreamSummary and ListShards instead)
    "kinesis:SubscribeToShard",
    "kinesis:RegisterStreamConsumer",
    "kinesis:DescribeStreamConsumer",
    "kinesis:ListStreams",
    "kinesis:PutRecord",
    "kinesis:PutRecords",
}
#: On the dead-letter streams: the write, and the check run() makes at the join.
DEAD_LETTER_WRITE = {"kinesis:DescribeStreamSummary", "kinesis:PutRecord"}

REGION = "eu-west-1"
CONSUMER_ACCOUNT = "111111111111"
STREAM_ACCOUNT = "222222222222"
STREAM_ARNS = [
    f"arn:aws:kinesis:{REGION}:{CONSUMER_ACCOUNT}:stream/orders",
    f"arn:aws:kinesis:{REGION}:{CONSUMER_ACCOUNT}:stream/payments",
]
REMOTE_STREAM_ARN = f"arn:aws:kinesis:{REGION}:{STREAM_ACCOUNT}:stream/clicks"
DEAD_LETTER_ARN = f"arn:aws:kinesis:{REGION}:{CONSUMER_ACCOUNT}:stream/orders-dead-letters"
REMOTE_DEAD_LETTER_ARN = f"arn:aws:kinesis:{REGION}:{STREAM_ACCOUNT}:stream/clicks-dead-letters"
TABLE_ARN = f"arn:aws:dynamodb:{REGION}:{CONSUMER_ACCOUNT}:table/kinesumer-state"
TABLE_KEY_ARN = f"arn:aws:kms:{REGION}:{CONSUMER_ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab"
READER_ROLE_ARN = f"arn:aws:iam::{STREAM_ACCOUNT}:role/kinesumer-reader"
EXTERNAL_ID = "orders-etl-7c1f"
CONSUMER_ROLE_ARN = f"arn:aws:iam::{CONSUMER_ACCOUNT}:role/orders-etl"
CONSUMER_ROLE_PATTERN = f"arn:aws:iam::{CONSUMER_ACCOUNT}:role/orders-etl-*"
STREAM_KEY_ARN = f"arn:aws:kms:{REGION}:{CONSUMER_ACCOUNT}:key/5678abcd-12ab-34cd-56ef-1234567890ab"
DEAD_LETTER_KEY_ARN = (
    f"arn:aws:kms:{REGION}:{CONSUMER_ACCOUNT}:key/9999abcd-12ab-34cd-56ef-1234567890ab"
)
REMOTE_STREAM_KEY_ARN = (
    f"arn:aws:kms:{REGION}:{STREAM_ACCOUNT}:key/aaaaabcd-12ab-34cd-56ef-1234567890ab"
)
APP = "orders-etl"

# Several accounts and regions: the app's account (CONSUMER_ACCOUNT) reads `orders` in two of its
# regions directly, and the stream account's through its role, trusted by two consumer accounts.
OTHER_REGION = "us-east-1"
THIRD_ACCOUNT = "333333333333"
REGION_STREAM_ARNS = [
    f"arn:aws:kinesis:{REGION}:{CONSUMER_ACCOUNT}:stream/orders",
    f"arn:aws:kinesis:{OTHER_REGION}:{CONSUMER_ACCOUNT}:stream/orders",
]
REGION_KEY_ARNS = [
    f"arn:aws:kms:{REGION}:{CONSUMER_ACCOUNT}:key/1111abcd-12ab-34cd-56ef-1234567890ab",
    f"arn:aws:kms:{OTHER_REGION}:{CONSUMER_ACCOUNT}:key/2222abcd-12ab-34cd-56ef-1234567890ab",
]
REMOTE_REGION_STREAM_ARNS = [
    f"arn:aws:kinesis:{REGION}:{STREAM_ACCOUNT}:stream/orders",
    f"arn:aws:kinesis:{OTHER_REGION}:{STREAM_ACCOUNT}:stream/orders",
]
REMOTE_REGION_KEY_ARNS = [
    f"arn:aws:kms:{REGION}:{STREAM_ACCOUNT}:key/3333abcd-12ab-34cd-56ef-1234567890ab",
    f"arn:aws:kms:{OTHER_REGION}:{STREAM_ACCOUNT}:key/4444abcd-12ab-34cd-56ef-1234567890ab",
]
REGION_STREAM_KEYS = dict(zip(REGION_STREAM_ARNS, REGION_KEY_ARNS, strict=True))
REMOTE_REGION_STREAM_KEYS = dict(
    zip(REMOTE_REGION_STREAM_ARNS, REMOTE_REGION_KEY_ARNS, strict=True)
)
TABLE_STREAM_ARN = (
    f"arn:aws:dynamodb:{REGION}:{CONSUMER_ACCOUNT}:table/orders/stream/2026-01-01T00:00:00.000"
)
REMOTE_TABLE_STREAM_ARN = (
    f"arn:aws:dynamodb:{OTHER_REGION}:{STREAM_ACCOUNT}:table/orders/stream/2026-01-01T00:00:00.000"
)
THIRD_ROLE_PATTERN = f"arn:aws:iam::{THIRD_ACCOUNT}:role/billing-*"
THIRD_EXTERNAL_ID = "billing-2b9e"


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def has_wildcard(value: str) -> bool:
    return "*" in value or "?" in value


# --- the state table, parsed ----------------------------------------------------------------------


def test_state_table_matches_library_schema() -> None:
    table = table_definition()
    assert schema_mismatches(table) == []
    # Spelled out as well, so a failure names the field.
    assert table.hash_key == PARTITION_KEY
    assert table.range_key == SORT_KEY
    assert table.attributes == {PARTITION_KEY: "S", SORT_KEY: "S"}
    assert table.ttl_attribute == TTL_ATTRIBUTE
    assert table.ttl_enabled is True
    assert table.secondary_indexes == ()


def test_state_table_defaults_are_the_safe_ones() -> None:
    table = table_definition()
    assert table.billing_mode == "PAY_PER_REQUEST"
    assert (table.read_capacity, table.write_capacity) == (None, None)
    assert table.point_in_time_recovery is True
    assert table.deletion_protection is True
    # AWS-owned key unless a customer-managed key is given.
    assert (table.sse_enabled, table.kms_key_arn) == (False, None)


def test_state_table_options_follow_their_variables() -> None:
    table = table_definition(
        variables={
            "billing_mode": "PROVISIONED",
            "read_capacity": 5,
            "write_capacity": 7,
            "kms_key_arn": TABLE_KEY_ARN,
            "point_in_time_recovery": False,
            "deletion_protection": False,
        }
    )
    assert (table.billing_mode, table.read_capacity, table.write_capacity) == ("PROVISIONED", 5, 7)
    assert (table.sse_enabled, table.kms_key_arn) == (True, TABLE_KEY_ARN)
    assert (table.point_in_time_recovery, table.deletion_protection) == (False, False)


def test_every_variable_has_a_type_and_a_description() -> None:
    for module_dir in [*sorted(MODULES_DIR.iterdir()), INFRA_DIR / "examples" / "basic"]:
        for name, spec in module_variables(load_module(module_dir)).items():
            where = f"{module_dir.relative_to(INFRA_DIR)}: variable {name}"
            assert spec.get("type"), f"{where} has no type"
            assert str(spec.get("description", "")).strip(), f"{where} has no description"


def _tampered_copy(tmp_path: Path, old: str, new: str) -> Path:
    copy = tmp_path / "state-table"
    shutil.copytree(STATE_TABLE_DIR, copy)
    main = copy / "main.tf"
    text = main.read_text()
    assert old in text, f"{old!r} not in state-table/main.tf: update this test"
    main.write_text(text.replace(old, new, 1))
    return copy


@pytest.mark.parametrize(
    ("old", "new", "complaint"),
    [
        ('hash_key  = "pk"', 'hash_key  = "id"', "hash_key"),
        ('range_key = "sk"', 'range_key = "pk"', "range_key"),
        ('type = "S"', 'type = "N"', "attribute definitions"),
        ('attribute_name = "expires_at"', 'attribute_name = "ttl"', "TTL attribute"),
        ("enabled        = true", "enabled        = false", "TTL is not enabled"),
        (
            "  attribute {\n",
            '  attribute {\n    name = "owner"\n    type = "S"\n  }\n\n  attribute {\n',
            "attribute definitions",
        ),
    ],
)
def test_schema_check_catches_drift(tmp_path: Path, old: str, new: str, complaint: str) -> None:
    """The schema check reads the file: a changed copy of the module is reported."""
    problems = schema_mismatches(table_definition(_tampered_copy(tmp_path, old, new)))
    assert any(complaint in p for p in problems), problems


def test_schema_parts_must_be_literals(tmp_path: Path) -> None:
    copy = _tampered_copy(tmp_path, 'hash_key  = "pk"', "hash_key  = var.name")
    with pytest.raises(TerraformParseError, match="hash_key must be a literal"):
        table_definition(copy)


# --- the table created from the parsed definition -------------------------------------------------


@pytest.fixture
def dynamodb() -> Iterator[Any]:
    with mock_aws():
        yield boto3.client(
            "dynamodb", region_name=REGION, aws_access_key_id="test", aws_secret_access_key="test"
        )


def test_table_created_from_terraform_matches_schema(dynamodb: Any) -> None:
    create_table_from_terraform(dynamodb, "kinesumer-state")

    table = dynamodb.describe_table(TableName="kinesumer-state")["Table"]
    assert table["TableStatus"] == "ACTIVE"
    assert sorted((k["AttributeName"], k["KeyType"]) for k in table["KeySchema"]) == sorted(
        [(PARTITION_KEY, "HASH"), (SORT_KEY, "RANGE")]
    )
    assert sorted(
        (a["AttributeName"], a["AttributeType"]) for a in table["AttributeDefinitions"]
    ) == (sorted([(PARTITION_KEY, "S"), (SORT_KEY, "S")]))
    assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    assert table["DeletionProtectionEnabled"] is True
    assert not table.get("GlobalSecondaryIndexes") and not table.get("LocalSecondaryIndexes")

    ttl = dynamodb.describe_time_to_live(TableName="kinesumer-state")["TimeToLiveDescription"]
    assert ttl == {"TimeToLiveStatus": "ENABLED", "AttributeName": TTL_ATTRIBUTE}

    backups = dynamodb.describe_continuous_backups(TableName="kinesumer-state")
    pitr = backups["ContinuousBackupsDescription"]["PointInTimeRecoveryDescription"]
    assert pitr["PointInTimeRecoveryStatus"] == "ENABLED"


def test_table_created_from_terraform_is_usable(dynamodb: Any) -> None:
    """Item calls the library makes work on the table (conditional put, query by pk)."""
    create_table_from_terraform(dynamodb, "state", variables={"deletion_protection": False})
    pk = "check_point#app#orders"
    dynamodb.put_item(
        TableName="state",
        Item={
            PARTITION_KEY: {"S": pk},
            SORT_KEY: {"S": "shardId-000000000000"},
            "owner": {"S": "c1"},
        },
        ConditionExpression="attribute_not_exists(#pk)",
        ExpressionAttributeNames={"#pk": PARTITION_KEY},
    )
    items = dynamodb.query(
        TableName="state",
        KeyConditionExpression="#pk = :pk",
        ExpressionAttributeNames={"#pk": PARTITION_KEY},
        ExpressionAttributeValues={":pk": {"S": pk}},
    )["Items"]
    assert [i["owner"]["S"] for i in items] == ["c1"]
    dynamodb.delete_table(TableName="state")  # deletion protection off, as asked


def test_table_created_from_terraform_provisioned(dynamodb: Any) -> None:
    create_table_from_terraform(
        dynamodb,
        "prov",
        variables={
            "billing_mode": "PROVISIONED",
            "read_capacity": 3,
            "write_capacity": 4,
            "point_in_time_recovery": False,
        },
    )
    table = dynamodb.describe_table(TableName="prov")["Table"]
    assert table.get("BillingModeSummary", {}).get("BillingMode", "PROVISIONED") == "PROVISIONED"
    throughput = table["ProvisionedThroughput"]
    assert (throughput["ReadCapacityUnits"], throughput["WriteCapacityUnits"]) == (3, 4)
    backups = dynamodb.describe_continuous_backups(TableName="prov")
    pitr = backups["ContinuousBackupsDescription"]["PointInTimeRecoveryDescription"]
    assert pitr["PointInTimeRecoveryStatus"] == "DISABLED"


def test_table_from_tampered_terraform_differs(dynamodb: Any, tmp_path: Path) -> None:
    """create_table_from_terraform really uses the parsed file, not hard-coded names."""
    copy = _tampered_copy(tmp_path, 'attribute_name = "expires_at"', 'attribute_name = "ttl_at"')
    create_table_from_terraform(dynamodb, "t", module_dir=copy)
    ttl = dynamodb.describe_time_to_live(TableName="t")["TimeToLiveDescription"]
    assert ttl["AttributeName"] == "ttl_at"


# --- least privilege, parsed ----------------------------------------------------------------------


def _service_of(statement: dict[str, Any]) -> set[str]:
    return {a.split(":", 1)[0] for a in as_list(statement["actions"])}


def _check_static_statement(statement: dict[str, Any], where: str) -> None:
    actions = statement.get("actions")
    assert isinstance(actions, list), f"{where}: actions must be a literal list, got {actions!r}"
    for action in actions:
        assert isinstance(action, str) and not has_wildcard(action), f"{where}: action {action!r}"
        assert ":" in action, f"{where}: action {action!r} has no service prefix"
    assert not statement.get("not_actions") and not statement.get("not_resources"), where
    assert statement.get("effect", "Allow") == "Allow", where
    resources = statement.get("resources")
    assert resources is not None, f"{where}: no resources"
    if statement.get("sid") == "KinesisEnhancedFanOutSubscribe":
        # The one wildcard: a consumer ARN's trailing creation timestamp.
        assert resources in EFO_CONSUMER_RESOURCES.values(), f"{where}: resources {resources!r}"
        return
    if statement.get("sid") == STREAM_KEY_STATEMENT["sid"]:
        # One statement per key of stream_kms_keys (a validated map of stream ARN to key ARN).
        assert statement == STREAM_KEY_STATEMENT, where
        return
    for resource in as_list(resources):
        # Either a variable (validated to be a full ARN) or a literal, and no wildcard in either
        # (not even around a variable, as in "${var.table_arn}/index/*").
        assert "*" not in resource, f"{where}: resource {resource!r}"
        if "${" in resource:
            assert "var." in resource, f"{where}: resource {resource!r} is not a variable"
        else:
            assert not has_wildcard(resource), f"{where}: resource {resource!r}"


def _read_and_dead_letter_statements(
    statements: list[dict[str, Any]],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Kinesis statements of a module: the reads, and the dead-letter writes (the enhanced
    fan-out ones are checked by test_enhanced_fan_out_statements)."""
    by_sid = {s.get("sid"): s for s in statements}
    assert set(by_sid) == {"KinesisRead", "KinesisDeadLetterWrite"} | EFO_SIDS, by_sid
    return by_sid["KinesisRead"], by_sid["KinesisDeadLetterWrite"]


@pytest.mark.parametrize(
    ("module_dir", "document"),
    [("consumer-policy", "this"), ("cross-account-role", "kinesis_read")],
)
def test_enhanced_fan_out_statements(module_dir: str, document: str) -> None:
    """Registration on the streams, describe and subscribe on each stream's named consumer;
    both only when enabled (``for_each`` on var.enhanced_fan_out, checked rendered below)."""
    directory = CONSUMER_POLICY_DIR if module_dir == "consumer-policy" else CROSS_ACCOUNT_ROLE_DIR
    streams = "var.stream_arns" if module_dir == "consumer-policy" else "local.stream_arns"
    by_sid = {s.get("sid"): s for s in policy_statements(directory, document)}
    register = by_sid["KinesisEnhancedFanOutRegister"]
    assert set(register["actions"]) == EFO_REGISTER
    assert as_list(register["resources"]) == (
        ["${sort(distinct(var.stream_arns))}"]
        if module_dir == "consumer-policy"
        else [ROLE_STREAM_ARNS]
    )
    subscribe = by_sid["KinesisEnhancedFanOutSubscribe"]
    assert set(subscribe["actions"]) == EFO_SUBSCRIBE
    assert subscribe["resources"] == EFO_CONSUMER_RESOURCES[module_dir]
    text = (directory / "main.tf").read_text(encoding="utf-8")
    assert text.count(f"for_each = var.enhanced_fan_out && length({streams}) > 0") == 2


def test_consumer_policy_grants_only_the_library_calls_on_named_resources() -> None:
    statements = list(policy_statements(CONSUMER_POLICY_DIR, "this"))
    assert statements, "no statements parsed"
    by_service: dict[str, list[dict[str, Any]]] = {}
    for statement in statements:
        _check_static_statement(statement, f"consumer-policy {statement.get('sid')}")
        for service in _service_of(statement):
            by_service.setdefault(service, []).append(statement)

    kinesis, dead_letters = _read_and_dead_letter_statements(by_service["kinesis"])
    assert set(kinesis["actions"]) == KINESIS_READ_ACTIONS
    assert _service_of(kinesis) == {"kinesis"}
    assert as_list(kinesis["resources"]) == ["${sort(distinct(var.stream_arns))}"]
    assert dead_letters["actions"] == sorted(DEAD_LETTER_WRITE)
    assert as_list(dead_letters["resources"]) == ["${sort(distinct(var.dead_letter_stream_arns))}"]

    table_streams, items, describe = sorted(by_service["dynamodb"], key=lambda st: st["sid"])
    assert (table_streams["sid"], items["sid"], describe["sid"]) == (
        "DynamoDBStreamsRead",
        "StateTable",
        "StateTableDescribe",
    )
    assert set(table_streams["actions"]) == TABLE_STREAM_READ_ACTIONS
    assert as_list(table_streams["resources"]) == ["${sort(distinct(var.table_stream_arns))}"]
    assert not table_streams.get("condition")
    assert set(items["actions"]) == DYNAMODB_ITEM_ACTIONS
    assert describe["actions"] == ["dynamodb:DescribeTable"] and not describe.get("condition")
    for dynamodb in (items, describe):
        assert as_list(dynamodb["resources"]) == ["${var.table_arn}"]  # no index/* either
    # Item calls only on the apps' own keys, and only with keys (checked rendered below).
    conditions = [(c["test"], c["variable"], c["values"]) for c in items["condition"]]
    assert conditions == [
        ("ForAllValues:StringLike", "dynamodb:LeadingKeys", "${local.state_table_leading_keys}"),
        ("Null", "dynamodb:LeadingKeys", ["false"]),
    ]

    (sts,) = by_service["sts"]
    assert sts["actions"] == ["sts:AssumeRole"]
    assert as_list(sts["resources"]) == ["${sort(distinct(var.assume_role_arns))}"]

    assert set(by_service) <= {"kinesis", "dynamodb", "sts", "kms"}
    kms_resources = {r for s in by_service.get("kms", []) for r in as_list(s["resources"])}
    assert kms_resources == {
        "${var.table_kms_key_arn}",
        "${sort(distinct(var.stream_kms_key_arns))}",
        "${statement.key}",  # stream_kms_keys, one statement per key (STREAM_KEY_STATEMENT)
        "${sort(distinct(var.dead_letter_stream_kms_key_arns))}",
    }
    for statement in by_service["kms"]:  # every key only through its service
        variables = {c["variable"] for c in statement["condition"]}
        assert "kms:ViaService" in variables, statement


def test_cross_account_role_policies() -> None:
    trust = {s["sid"]: s for s in policy_statements(CROSS_ACCOUNT_ROLE_DIR, "trust")}
    assert set(trust) == {
        "KinesumerConsumers",
        "KinesumerConsumersByArn",
        "KinesumerConsumers${statement.key}",
        "KinesumerConsumersByArn${statement.key}",
    }
    for statement in trust.values():
        assert statement["actions"] == ["sts:AssumeRole"]
        assert statement.get("effect", "Allow") == "Allow"
        (principals,) = statement["principals"]
        assert principals["type"] == "AWS"
        conditions = [(c["test"], c["variable"], c["values"]) for c in statement["condition"]]
        external_id = (
            "${local.account_external_ids[statement.key]}"
            if "statement.key" in statement["sid"]
            else "${var.external_id}"
        )
        assert ("StringEquals", "sts:ExternalId", [external_id]) in conditions
    # Named roles as given (validated: role/user ARNs, never an account or :root) ...
    assert trust["KinesumerConsumers"]["principals"][0]["identifiers"] == (
        "${sort(distinct(var.consumer_principals))}"
    )
    # ... or their accounts, only for the principals an aws:PrincipalArn condition names.
    by_arn = trust["KinesumerConsumersByArn"]
    assert (
        "ArnLike",
        "aws:PrincipalArn",
        "${sort(distinct(var.consumer_principal_arn_patterns))}",
    ) in [(c["test"], c["variable"], c["values"]) for c in by_arn["condition"]]
    # Per consumer account (consumer_accounts, keyed by validated account ids): its named roles,
    # or its root narrowed by aws:PrincipalArn to its patterns, with that account's external id.
    account = trust["KinesumerConsumers${statement.key}"]
    assert account["principals"] == [{"type": "AWS", "identifiers": "${statement.value}"}]
    assert len(account["condition"]) == 1
    account_by_arn = trust["KinesumerConsumersByArn${statement.key}"]
    assert account_by_arn["principals"][0]["identifiers"] == [
        "arn:${data.aws_partition.current.partition}:iam::${statement.key}:root"
    ]
    assert ("ArnLike", "aws:PrincipalArn", "${statement.value}") in [
        (c["test"], c["variable"], c["values"]) for c in account_by_arn["condition"]
    ]

    read = list(policy_statements(CROSS_ACCOUNT_ROLE_DIR, "kinesis_read"))
    for s in read:
        _check_static_statement(s, f"cross-account-role {s.get('sid')}")
    kinesis, dead_letters = _read_and_dead_letter_statements(
        [s for s in read if _service_of(s) == {"kinesis"}]
    )
    assert set(kinesis["actions"]) == KINESIS_READ_ACTIONS
    assert as_list(kinesis["resources"]) == [ROLE_STREAM_ARNS]
    assert dead_letters["actions"] == sorted(DEAD_LETTER_WRITE)
    assert as_list(dead_letters["resources"]) == ["${sort(distinct(var.dead_letter_stream_arns))}"]
    (table_streams,) = [s for s in read if _service_of(s) == {"dynamodb"}]
    assert table_streams["sid"] == "DynamoDBStreamsRead"
    assert set(table_streams["actions"]) == TABLE_STREAM_READ_ACTIONS
    assert as_list(table_streams["resources"]) == ["${sort(distinct(var.table_stream_arns))}"]
    assert all(_service_of(s) <= {"kinesis", "kms", "dynamodb"} for s in read), (
        "role grants more than reading streams"
    )


# `kinesumer create-table` and the demo: local work, not granted. The producer's calls are the
# producer policy's (tests/infra/test_infra_producer_policy.py).
NOT_THE_CONSUMERS = ("admin/", "cli/create_table.py", "cli/demo/", "producer/")


def _library_calls() -> dict[str, set[str]]:
    """IAM actions of the AWS operations a consumer's code calls ({action: {files}})."""
    return library_calls([""], leave_out=NOT_THE_CONSUMERS)


def test_policies_cover_every_call_the_library_makes() -> None:
    """A new AWS call in kinesumer/ fails here until the policies grant it."""
    calls = _library_calls()
    # The scan must keep finding the core calls, or it has stopped seeing anything.
    assert {"kinesis:GetRecords", "dynamodb:UpdateItem", "kinesis:PutRecord"} <= set(calls), calls
    granted = KINESIS_READ_ACTIONS | DYNAMODB_ACTIONS | DEAD_LETTER_WRITE | {"sts:AssumeRole"}
    granted |= TABLE_STREAM_READ_ACTIONS
    granted |= EFO_REGISTER | EFO_SUBSCRIBE | OPERATOR_ONLY | LAG_SERVICE_ONLY
    granted |= NEEDS_NO_PERMISSION
    assert set(calls) >= LAG_SERVICE_ONLY, "the scan no longer sees the lag service's publish"
    missing = {action: sorted(files) for action, files in calls.items() if action not in granted}
    assert not missing, f"calls the IAM policies in infra/ do not grant: {missing}"
    parsed = {
        action
        for module_dir, document in [
            (CONSUMER_POLICY_DIR, "this"),
            (CROSS_ACCOUNT_ROLE_DIR, "kinesis_read"),
        ]
        for statement in policy_statements(module_dir, document)
        for action in as_list(statement["actions"])
    }
    assert set(calls) - OPERATOR_ONLY - LAG_SERVICE_ONLY - NEEDS_NO_PERMISSION <= parsed
    assert not LAG_SERVICE_ONLY & parsed, "members never publish to CloudWatch"


def _table_stream_calls() -> set[str]:
    """IAM actions of the calls kinesumer makes on DynamoDB Streams: those of its aiobotocore
    ``dynamodbstreams`` client, named ``client`` in kinesis/dynamodb_streams.py."""
    calls = library_calls(["kinesis"], receivers={"client": "dynamodb"})
    return {a for a, files in calls.items() if "kinesumer/kinesis/dynamodb_streams.py" in files}


def test_table_stream_grants_are_the_library_calls() -> None:
    """Both modules grant on table streams exactly what kinesumer calls on them."""
    assert _table_stream_calls() == TABLE_STREAM_READ_ACTIONS
    for module_dir, document in [
        (CONSUMER_POLICY_DIR, "this"),
        (CROSS_ACCOUNT_ROLE_DIR, "kinesis_read"),
    ]:
        by_sid = {s.get("sid"): s for s in policy_statements(module_dir, document)}
        assert set(by_sid["DynamoDBStreamsRead"]["actions"]) == _table_stream_calls(), module_dir


def test_external_id_is_required_and_sensitive() -> None:
    """external_id may be left out only where every consumer_accounts entry has its own (the
    validation that says so is planned in BAD_INPUTS: missing_external_id...)."""
    module = load_module(CROSS_ACCOUNT_ROLE_DIR)
    variables = module_variables(module)
    spec = variables["external_id"]
    assert spec.get("default", "missing") is None
    assert len(spec.get("validation", [])) == 2, "external_id must be validated, and required"
    assert spec.get("sensitive") is True, "external_id must be sensitive (kept out of plans)"
    # consumer_accounts holds per-account external ids: sensitive as a whole.
    assert variables["consumer_accounts"].get("sensitive") is True
    # The trust policy holds it: its output must be sensitive too (Terraform insists).
    outputs = {name: o for block in module.get("output", []) for name, o in block.items()}
    assert outputs["trust_policy_json"].get("sensitive") is True


# --- terraform itself: fmt, validate, rendered plans ----------------------------------------------


@cache
def _terraform() -> str | None:
    return shutil.which("terraform")


@cache
def _plugin_dir() -> Path | None:
    """The equivalent of ``find / -maxdepth 3 -type d -name tf-plugins`` (first match)."""
    frontier = [Path("/")]
    for _depth in range(3):
        next_frontier: list[Path] = []
        for parent in frontier:
            try:
                children = sorted(os.scandir(parent), key=lambda e: e.name)
            except OSError:
                continue
            for child in children:
                if child.path in ("/proc", "/sys", "/dev"):
                    continue
                try:
                    if not child.is_dir(follow_symlinks=False):
                        continue
                except OSError:
                    continue
                if child.name == "tf-plugins":
                    return Path(child.path)
                next_frontier.append(Path(child.path))
        frontier = next_frontier
    return None


def _require_terraform(plugins: bool = True) -> tuple[str, Path | None]:
    terraform = _terraform()
    if terraform is None:
        pytest.skip("terraform not found on PATH")
    plugin_dir = _plugin_dir()
    if plugins and plugin_dir is None:
        pytest.skip("no tf-plugins folder (find / -maxdepth 3 -type d -name tf-plugins found none)")
    return terraform, plugin_dir


_AWS_IDENTITY_ENV = {
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
}


def _tf_env() -> dict[str, str]:
    env = dict(os.environ)
    # No version check call home, no prompts, and no real AWS identity: the plans below use
    # dummy keys, and a stray profile in the environment would make the provider look it up.
    for name in list(env):
        if name in _AWS_IDENTITY_ENV or name.startswith("AWS_ENDPOINT_URL"):
            del env[name]
    env.update(
        CHECKPOINT_DISABLE="1", TF_IN_AUTOMATION="1", TF_INPUT="0", AWS_EC2_METADATA_DISABLED="true"
    )
    return env


def _run(args: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, cwd=cwd, env=_tf_env(), capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        pytest.fail(
            f"{' '.join(args)} in {cwd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def _init(terraform: str, plugin_dir: Path, cwd: Path) -> None:
    _run(
        [
            terraform,
            "init",
            "-backend=false",
            f"-plugin-dir={plugin_dir}",
            "-input=false",
            "-no-color",
        ],
        cwd,
    )


@pytest.fixture(scope="session")
def infra_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of infra/ (without any .terraform state) in which terraform may write."""
    copy = tmp_path_factory.mktemp("tf") / "infra"
    shutil.copytree(INFRA_DIR, copy, ignore=shutil.ignore_patterns(".terraform*", "*.tfstate*"))
    return copy


def test_terraform_fmt() -> None:
    terraform, _ = _require_terraform(plugins=False)
    proc = _run(
        [terraform, "fmt", "-check", "-recursive", "-diff", "-no-color", str(INFRA_DIR)],
        INFRA_DIR.parent,
        check=False,
    )
    assert proc.returncode == 0, f"terraform fmt would change:\n{proc.stdout}{proc.stderr}"


@pytest.mark.parametrize("rel", TERRAFORM_DIRS)
def test_terraform_validate(infra_copy: Path, rel: str) -> None:
    terraform, plugin_dir = _require_terraform()
    assert plugin_dir is not None
    cwd = infra_copy / rel
    _init(terraform, plugin_dir, cwd)
    proc = _run([terraform, "validate", "-json", "-no-color"], cwd, check=False)
    result = json.loads(proc.stdout)
    assert result["valid"] is True, json.dumps(result["diagnostics"], indent=2)
    assert proc.returncode == 0
    assert not [d for d in result["diagnostics"] if d["severity"] == "warning"], result


# A root module calling every module with known inputs, on a provider with dummy credentials and
# every lookup switched off: `terraform plan` then renders the policy documents (computed locally
# by the provider) and the planned table without any network.
FAKE_PROVIDER = f"""
provider "aws" {{
  region                      = "{REGION}"
  access_key                  = "test"
  secret_key                  = "test"
  skip_credentials_validation = true
  skip_requesting_account_id  = true
  skip_metadata_api_check     = true
  skip_region_validation      = true
}}
"""

RENDER_ROOT = (
    FAKE_PROVIDER
    + f"""
module "table" {{
  source = "../modules/state-table"
  name   = "kinesumer-state"
}}

module "table_custom" {{
  source                 = "../modules/state-table"
  name                   = "kinesumer-state-2"
  billing_mode           = "PROVISIONED"
  read_capacity          = 5
  write_capacity         = 6
  kms_key_arn            = "{TABLE_KEY_ARN}"
  point_in_time_recovery = false
  deletion_protection    = false
}}

module "policy" {{
  source           = "../modules/consumer-policy"
  apps             = ["{APP}"]
  stream_arns      = {json.dumps(STREAM_ARNS)}
  table_arn        = "{TABLE_ARN}"
  assume_role_arns = ["{READER_ROLE_ARN}"]
  dead_letter_stream_arns = ["{DEAD_LETTER_ARN}"]
}}

module "policy_with_keys" {{
  source              = "../modules/consumer-policy"
  apps                = ["{APP}", "billing"]
  stream_arns         = {json.dumps(STREAM_ARNS[:1])}
  table_arn           = "{TABLE_ARN}"
  table_kms_key_arn   = "{TABLE_KEY_ARN}"
  stream_kms_key_arns = ["{STREAM_KEY_ARN}"]
  dead_letter_stream_arns = ["{DEAD_LETTER_ARN}"]
  dead_letter_stream_kms_key_arns = ["{DEAD_LETTER_KEY_ARN}"]
  create_policy       = false
}}

module "role" {{
  source               = "../modules/cross-account-role"
  name                 = "kinesumer-reader"
  external_id          = "{EXTERNAL_ID}"
  consumer_principals  = ["{CONSUMER_ROLE_ARN}"]
  consumer_principal_arn_patterns = ["{CONSUMER_ROLE_PATTERN}"]
  stream_arns          = ["{REMOTE_STREAM_ARN}"]
  stream_kms_key_arns  = ["{REMOTE_STREAM_KEY_ARN}"]
  max_session_duration = 7200
  dead_letter_stream_arns = ["{REMOTE_DEAD_LETTER_ARN}"]
  dead_letter_stream_kms_key_arns = ["{REMOTE_STREAM_KEY_ARN}"]
}}

module "policy_efo" {{
  source           = "../modules/consumer-policy"
  apps             = ["{APP}"]
  stream_arns      = {json.dumps(STREAM_ARNS)}
  table_arn        = "{TABLE_ARN}"
  enhanced_fan_out = true
  consumer_name    = "orders-etl"
  create_policy    = false
}}

module "role_efo" {{
  source              = "../modules/cross-account-role"
  name                = "kinesumer-reader-efo"
  external_id         = "{EXTERNAL_ID}"
  consumer_principals = ["{CONSUMER_ROLE_ARN}"]
  stream_arns         = ["{REMOTE_STREAM_ARN}"]
  enhanced_fan_out    = true
  consumer_name       = "orders-etl"
}}

module "policy_regions" {{
  source            = "../modules/consumer-policy"
  apps              = ["{APP}"]
  stream_arns       = {json.dumps(REGION_STREAM_ARNS)}
  stream_kms_keys   = {json.dumps(REGION_STREAM_KEYS)}
  table_stream_arns = ["{TABLE_STREAM_ARN}"]
  table_arn         = "{TABLE_ARN}"
  assume_role_arns  = ["{READER_ROLE_ARN}"]
  create_policy     = false
}}

module "role_accounts" {{
  source      = "../modules/cross-account-role"
  name        = "kinesumer-reader-accounts"
  external_id = "{EXTERNAL_ID}"
  consumer_accounts = {{
    "{CONSUMER_ACCOUNT}" = {{ principals = ["{CONSUMER_ROLE_ARN}"] }}
    "{THIRD_ACCOUNT}" = {{
      principal_arn_patterns = ["{THIRD_ROLE_PATTERN}"]
      external_id            = "{THIRD_EXTERNAL_ID}"
    }}
  }}
  stream_arns       = {json.dumps(REMOTE_REGION_STREAM_ARNS)}
  stream_kms_keys   = {json.dumps(REMOTE_REGION_STREAM_KEYS)}
  table_stream_arns = ["{REMOTE_TABLE_STREAM_ARN}"]
}}

output "policy" {{ value = module.policy.policy_json }}
output "policy_regions" {{ value = module.policy_regions.policy_json }}
output "role_accounts_policy" {{ value = module.role_accounts.kinesis_policy_json }}
output "trust_accounts" {{
  value     = module.role_accounts.trust_policy_json
  sensitive = true
}}
output "policy_efo" {{ value = module.policy_efo.policy_json }}
output "role_policy_efo" {{ value = module.role_efo.kinesis_policy_json }}
output "policy_with_keys" {{ value = module.policy_with_keys.policy_json }}
output "policy_with_keys_arn" {{ value = module.policy_with_keys.policy_arn }}
output "trust" {{
  value     = module.role.trust_policy_json
  sensitive = true
}}
output "trust_efo" {{
  value     = module.role_efo.trust_policy_json
  sensitive = true
}}
output "role_policy" {{ value = module.role.kinesis_policy_json }}
"""
)


@pytest.fixture(scope="session")
def rendered(infra_copy: Path) -> dict[str, Any]:
    """``terraform show -json`` of a plan of RENDER_ROOT."""
    terraform, plugin_dir = _require_terraform()
    assert plugin_dir is not None
    root = infra_copy / "_render"
    root.mkdir()
    (root / "main.tf").write_text(RENDER_ROOT)
    _init(terraform, plugin_dir, root)
    _run([terraform, "plan", "-input=false", "-no-color", "-refresh=false", "-out=plan.bin"], root)
    show = _run([terraform, "show", "-json", "plan.bin"], root)
    return json.loads(show.stdout)  # type: ignore[no-any-return]


def _output(plan: dict[str, Any], name: str) -> Any:
    return plan["planned_values"]["outputs"][name]["value"]


def _statements(policy_json: str) -> list[dict[str, Any]]:
    document = json.loads(policy_json)
    assert document["Version"] == "2012-10-17"
    return [dict(s) for s in document["Statement"]]


def _resources(plan: dict[str, Any], module: str) -> dict[str, dict[str, Any]]:
    """Planned managed resources of a module call: {address in the module: values}."""
    assert f'module "{module}"' in RENDER_ROOT, module
    for child in plan["planned_values"]["root_module"].get("child_modules", []):
        if child["address"] == f"module.{module}":
            return {
                r["address"].removeprefix(f"module.{module}."): r["values"]
                for r in child.get("resources", [])
                if r["mode"] == "managed"
            }
    return {}  # a module that plans no resource is left out of planned_values


def _assert_least_privilege(statements: list[dict[str, Any]]) -> None:
    for s in statements:
        assert s["Effect"] == "Allow", s
        assert "NotAction" not in s and "NotResource" not in s, s
        for action in as_list(s["Action"]):
            assert not has_wildcard(action), s
        for resource in as_list(s["Resource"]):
            assert not has_wildcard(resource), s


def test_rendered_consumer_policy(rendered: dict[str, Any]) -> None:
    statements = {s["Sid"]: s for s in _statements(_output(rendered, "policy"))}
    _assert_least_privilege(list(statements.values()))
    assert set(statements) == {
        "KinesisRead",
        "KinesisDeadLetterWrite",
        "StateTable",
        "StateTableDescribe",
        "AssumeStreamRoles",
    }
    assert set(as_list(statements["KinesisRead"]["Action"])) == KINESIS_READ_ACTIONS
    assert sorted(as_list(statements["KinesisRead"]["Resource"])) == sorted(STREAM_ARNS)
    dead_letters = statements.pop("KinesisDeadLetterWrite")
    assert set(as_list(dead_letters["Action"])) == DEAD_LETTER_WRITE
    assert as_list(dead_letters["Resource"]) == [DEAD_LETTER_ARN]
    assert set(as_list(statements["StateTable"]["Action"])) == DYNAMODB_ITEM_ACTIONS
    assert as_list(statements["StateTable"]["Resource"]) == [TABLE_ARN]
    assert set(statements["StateTable"]["Condition"]) == {"ForAllValues:StringLike", "Null"}
    assert as_list(statements["StateTableDescribe"]["Action"]) == ["dynamodb:DescribeTable"]
    assert as_list(statements["StateTableDescribe"]["Resource"]) == [TABLE_ARN]
    assert "Condition" not in statements["StateTableDescribe"]
    assert as_list(statements["AssumeStreamRoles"]["Action"]) == ["sts:AssumeRole"]
    assert as_list(statements["AssumeStreamRoles"]["Resource"]) == [READER_ROLE_ARN]
    all_actions = {a for s in statements.values() for a in as_list(s["Action"])}
    assert not all_actions & FORBIDDEN_KINESIS_ACTIONS
    assert not {a for a in all_actions if a.startswith("dynamodb:")} - DYNAMODB_ACTIONS

    policy = _resources(rendered, "policy")["aws_iam_policy.this[0]"]
    assert json.loads(policy["policy"]) == json.loads(_output(rendered, "policy"))
    # No policy_name given: a generated name (unknown until apply, so absent from the plan).
    assert policy.get("name") is None and policy["name_prefix"] == "kinesumer-consumer-"


@pytest.mark.parametrize(
    ("output", "streams"),
    [("policy_efo", STREAM_ARNS), ("role_policy_efo", [REMOTE_STREAM_ARN])],
)
def test_rendered_enhanced_fan_out(
    rendered: dict[str, Any], output: str, streams: list[str]
) -> None:
    statements = {s["Sid"]: s for s in _statements(_output(rendered, output))}
    register = statements.pop("KinesisEnhancedFanOutRegister")
    assert set(as_list(register["Action"])) == EFO_REGISTER
    assert sorted(as_list(register["Resource"])) == sorted(streams)
    subscribe = statements.pop("KinesisEnhancedFanOutSubscribe")
    assert set(as_list(subscribe["Action"])) == EFO_SUBSCRIBE
    consumers = sorted(f"{arn}/consumer/orders-etl:*" for arn in streams)
    assert sorted(as_list(subscribe["Resource"])) == consumers
    _assert_least_privilege(list(statements.values()))
    assert "KinesisRead" in statements
    actions = {a for s in statements.values() for a in as_list(s["Action"])}
    assert not actions & (EFO_REGISTER | EFO_SUBSCRIBE | OPERATOR_ONLY)


def _conditions(statement: dict[str, Any]) -> dict[str, dict[str, list[str]]]:
    """A rendered statement's conditions, every value as a sorted list."""
    return {
        test: {key: sorted(as_list(values)) for key, values in keys.items()}
        for test, keys in statement.get("Condition", {}).items()
    }


def test_rendered_consumer_policy_with_keys(rendered: dict[str, Any]) -> None:
    statements = {s["Sid"]: s for s in _statements(_output(rendered, "policy_with_keys"))}
    _assert_least_privilege(list(statements.values()))
    assert set(statements) == {
        "KinesisRead",
        "KinesisDeadLetterWrite",
        "StateTable",
        "StateTableDescribe",
        "StateTableKey",
        "StreamKeys",
        "DeadLetterStreamKeys",
    }
    table_key = statements["StateTableKey"]
    assert as_list(table_key["Resource"]) == [TABLE_KEY_ARN]
    assert table_key["Condition"] == {
        "StringEquals": {"kms:ViaService": f"dynamodb.{REGION}.amazonaws.com"}
    }
    # The streams' keys: only through Kinesis in their region, only for the streams named.
    stream_keys = statements["StreamKeys"]
    assert as_list(stream_keys["Action"]) == ["kms:Decrypt"]
    assert as_list(stream_keys["Resource"]) == [STREAM_KEY_ARN]
    assert _conditions(stream_keys) == {
        "StringEquals": {
            "kms:ViaService": [f"kinesis.{REGION}.amazonaws.com"],
            "kms:EncryptionContext:aws:kinesis:arn": STREAM_ARNS[:1],
        }
    }
    dead_letter_keys = statements["DeadLetterStreamKeys"]
    assert as_list(dead_letter_keys["Action"]) == ["kms:GenerateDataKey"]
    assert as_list(dead_letter_keys["Resource"]) == [DEAD_LETTER_KEY_ARN]
    assert _conditions(dead_letter_keys) == {
        "StringEquals": {
            "kms:ViaService": [f"kinesis.{REGION}.amazonaws.com"],
            "kms:EncryptionContext:aws:kinesis:arn": [DEAD_LETTER_ARN],
        }
    }
    # Both apps' keys, nobody else's.
    patterns = _conditions(statements["StateTable"])["ForAllValues:StringLike"]
    apps = {p.split("#")[1].split(".spark-")[0] for p in patterns["dynamodb:LeadingKeys"]}
    assert apps == {APP, "billing"}
    # create_policy = false: only the document.
    assert _output(rendered, "policy_with_keys_arn") is None
    assert _resources(rendered, "policy_with_keys") == {}


def test_rendered_cross_account_role(rendered: dict[str, Any]) -> None:
    trust = {s["Sid"]: s for s in _statements(_output(rendered, "trust"))}
    assert set(trust) == {"KinesumerConsumers", "KinesumerConsumersByArn"}
    for statement in trust.values():
        assert statement["Effect"] == "Allow"
        assert as_list(statement["Action"]) == ["sts:AssumeRole"]
    named = trust["KinesumerConsumers"]
    assert as_list(named["Principal"]["AWS"]) == [CONSUMER_ROLE_ARN]
    assert named["Condition"] == {"StringEquals": {"sts:ExternalId": EXTERNAL_ID}}
    by_arn = trust["KinesumerConsumersByArn"]
    assert as_list(by_arn["Principal"]["AWS"]) == [f"arn:aws:iam::{CONSUMER_ACCOUNT}:root"]
    assert by_arn["Condition"] == {
        "ArnLike": {"aws:PrincipalArn": CONSUMER_ROLE_PATTERN},
        "StringEquals": {"sts:ExternalId": EXTERNAL_ID},
    }
    # Never a bare account: every account principal is narrowed by aws:PrincipalArn.
    (only_roles,) = _statements(_output(rendered, "trust_efo"))
    assert as_list(only_roles["Principal"]["AWS"]) == [CONSUMER_ROLE_ARN]
    for statement in [*trust.values(), only_roles]:
        for principal in as_list(statement["Principal"]["AWS"]):
            if principal.endswith(":root"):
                assert "aws:PrincipalArn" in statement["Condition"].get("ArnLike", {}), statement

    read = _statements(_output(rendered, "role_policy"))
    _assert_least_privilege(read)
    by_sid = {s["Sid"]: s for s in read}
    assert set(by_sid) == {
        "KinesisRead",
        "KinesisDeadLetterWrite",
        "StreamKeys",
        "DeadLetterStreamKeys",
    }
    dead_letters = by_sid["KinesisDeadLetterWrite"]
    assert set(as_list(dead_letters["Action"])) == DEAD_LETTER_WRITE
    assert as_list(dead_letters["Resource"]) == [REMOTE_DEAD_LETTER_ARN]
    for sid, action, streams in [
        ("StreamKeys", "kms:Decrypt", [REMOTE_STREAM_ARN]),
        ("DeadLetterStreamKeys", "kms:GenerateDataKey", [REMOTE_DEAD_LETTER_ARN]),
    ]:
        assert as_list(by_sid[sid]["Action"]) == [action]
        assert as_list(by_sid[sid]["Resource"]) == [REMOTE_STREAM_KEY_ARN]
        assert _conditions(by_sid[sid]) == {
            "StringEquals": {
                "kms:ViaService": [f"kinesis.{REGION}.amazonaws.com"],
                "kms:EncryptionContext:aws:kinesis:arn": streams,
            }
        }
    kinesis = by_sid["KinesisRead"]
    assert not set(as_list(kinesis["Action"])) & FORBIDDEN_KINESIS_ACTIONS
    assert set(as_list(kinesis["Action"])) == KINESIS_READ_ACTIONS
    assert as_list(kinesis["Resource"]) == [REMOTE_STREAM_ARN]

    resources = _resources(rendered, "role")
    role = resources["aws_iam_role.this"]
    assert role["max_session_duration"] == 7200
    assert json.loads(role["assume_role_policy"]) == json.loads(_output(rendered, "trust"))
    assert json.loads(resources["aws_iam_role_policy.kinesis_read"]["policy"]) == json.loads(
        _output(rendered, "role_policy")
    )


def _key_statements(statements: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The stream_kms_keys statements ({key ARN: statement}), taken out of ``statements``."""
    keys = {}
    for sid in [sid for sid in statements if sid.startswith("StreamKey")]:
        statement = statements.pop(sid)
        (key,) = as_list(statement["Resource"])
        region, key_id = key.split(":")[3], key.split("/")[1]
        assert sid == "StreamKey" + region.replace("-", "") + key_id.replace("-", "")
        keys[key] = statement
    return keys


def _assert_each_key_for_its_stream(
    keys: dict[str, dict[str, Any]], streams: list[str], key_arns: list[str]
) -> None:
    """Each key: kms:Decrypt through Kinesis in its own region, for its own stream only."""
    assert sorted(keys) == sorted(key_arns)
    for stream, key in zip(streams, key_arns, strict=True):
        assert as_list(keys[key]["Action"]) == ["kms:Decrypt"]
        assert _conditions(keys[key]) == {
            "StringEquals": {
                "kms:ViaService": [f"kinesis.{stream.split(':')[3]}.amazonaws.com"],
                "kms:EncryptionContext:aws:kinesis:arn": [stream],
            }
        }


def test_rendered_consumer_policy_across_regions(rendered: dict[str, Any]) -> None:
    """Streams of two regions, each with its own key, a table's stream, and another account's
    streams through its role: exactly the calls kinesumer makes, on those resources."""
    statements = {s["Sid"]: s for s in _statements(_output(rendered, "policy_regions"))}
    _assert_least_privilege(list(statements.values()))
    keys = _key_statements(statements)
    _assert_each_key_for_its_stream(keys, REGION_STREAM_ARNS, REGION_KEY_ARNS)
    assert set(statements) == {
        "KinesisRead",
        "DynamoDBStreamsRead",
        "StateTable",
        "StateTableDescribe",
        "AssumeStreamRoles",
    }
    assert set(as_list(statements["KinesisRead"]["Action"])) == KINESIS_READ_ACTIONS
    assert sorted(as_list(statements["KinesisRead"]["Resource"])) == sorted(REGION_STREAM_ARNS)
    table_streams = statements["DynamoDBStreamsRead"]
    assert set(as_list(table_streams["Action"])) == _table_stream_calls()
    assert as_list(table_streams["Resource"]) == [TABLE_STREAM_ARN]
    assert "Condition" not in table_streams
    assert as_list(statements["AssumeStreamRoles"]["Resource"]) == [READER_ROLE_ARN]
    # The other account's streams are the role's: nothing on them here.
    assert REMOTE_STREAM_ARN not in json.dumps(list(statements.values()))


def test_rendered_cross_account_role_for_several_accounts(rendered: dict[str, Any]) -> None:
    """Two consumer accounts trusted, each for its named roles (or role patterns) and its own
    external id; the stream account's streams of two regions, their keys and a table's stream."""
    trust = {s["Sid"]: s for s in _statements(_output(rendered, "trust_accounts"))}
    assert set(trust) == {
        f"KinesumerConsumers{CONSUMER_ACCOUNT}",
        f"KinesumerConsumersByArn{THIRD_ACCOUNT}",
    }
    named = trust[f"KinesumerConsumers{CONSUMER_ACCOUNT}"]
    assert as_list(named["Action"]) == ["sts:AssumeRole"]
    assert as_list(named["Principal"]["AWS"]) == [CONSUMER_ROLE_ARN]
    # No external id of its own: the module's.
    assert named["Condition"] == {"StringEquals": {"sts:ExternalId": EXTERNAL_ID}}
    by_arn = trust[f"KinesumerConsumersByArn{THIRD_ACCOUNT}"]
    assert as_list(by_arn["Principal"]["AWS"]) == [f"arn:aws:iam::{THIRD_ACCOUNT}:root"]
    assert by_arn["Condition"] == {
        "ArnLike": {"aws:PrincipalArn": THIRD_ROLE_PATTERN},
        "StringEquals": {"sts:ExternalId": THIRD_EXTERNAL_ID},
    }

    statements = {s["Sid"]: s for s in _statements(_output(rendered, "role_accounts_policy"))}
    _assert_least_privilege(list(statements.values()))
    keys = _key_statements(statements)
    _assert_each_key_for_its_stream(keys, REMOTE_REGION_STREAM_ARNS, REMOTE_REGION_KEY_ARNS)
    assert set(statements) == {"KinesisRead", "DynamoDBStreamsRead"}
    assert set(as_list(statements["KinesisRead"]["Action"])) == KINESIS_READ_ACTIONS
    assert sorted(as_list(statements["KinesisRead"]["Resource"])) == sorted(
        REMOTE_REGION_STREAM_ARNS
    )
    assert set(as_list(statements["DynamoDBStreamsRead"]["Action"])) == _table_stream_calls()
    assert as_list(statements["DynamoDBStreamsRead"]["Resource"]) == [REMOTE_TABLE_STREAM_ARN]

    role = _resources(rendered, "role_accounts")["aws_iam_role.this"]
    assert json.loads(role["assume_role_policy"]) == json.loads(_output(rendered, "trust_accounts"))


def test_cross_account_role_streams_by_name(tmp_path: Path, moto_url: str) -> None:
    """stream_names per region become ARNs of the account the provider runs in (asked of STS:
    here moto's, on 127.0.0.1, whose caller is account 123456789012)."""
    terraform, plugin_dir = _require_terraform()
    assert plugin_dir is not None
    copy = tmp_path / "infra"
    shutil.copytree(INFRA_DIR, copy, ignore=shutil.ignore_patterns(".terraform*", "*.tfstate*"))
    root = copy / "_names"
    root.mkdir()
    provider = FAKE_PROVIDER.replace(
        "  skip_region_validation      = true\n",
        f'  skip_region_validation      = true\n  endpoints {{\n    sts = "{moto_url}"\n  }}\n',
    )
    (root / "main.tf").write_text(
        provider
        + f"""
module "role" {{
  source              = "../modules/cross-account-role"
  name                = "kinesumer-reader-names"
  external_id         = "{EXTERNAL_ID}"
  consumer_principals = ["{CONSUMER_ROLE_ARN}"]
  stream_names        = {{ "{REGION}" = ["orders", "payments"], "{OTHER_REGION}" = ["orders"] }}
  stream_arns         = ["{REMOTE_STREAM_ARN}"]
}}

output "role_policy" {{ value = module.role.kinesis_policy_json }}
"""
    )
    _init(terraform, plugin_dir, root)
    _run([terraform, "plan", "-input=false", "-no-color", "-refresh=false", "-out=plan.bin"], root)
    plan = json.loads(_run([terraform, "show", "-json", "plan.bin"], root).stdout)
    statements = {s["Sid"]: s for s in _statements(_output(plan, "role_policy"))}
    _assert_least_privilege(list(statements.values()))
    assert set(statements) == {"KinesisRead"}
    account = "123456789012"  # moto's default account
    assert sorted(as_list(statements["KinesisRead"]["Resource"])) == sorted(
        [
            f"arn:aws:kinesis:{REGION}:{account}:stream/orders",
            f"arn:aws:kinesis:{REGION}:{account}:stream/payments",
            f"arn:aws:kinesis:{OTHER_REGION}:{account}:stream/orders",
            REMOTE_STREAM_ARN,
        ]
    )


def test_planned_state_table(rendered: dict[str, Any]) -> None:
    table = _resources(rendered, "table")["aws_dynamodb_table.this"]
    assert (table["hash_key"], table["range_key"]) == (PARTITION_KEY, SORT_KEY)
    assert sorted((a["name"], a["type"]) for a in table["attribute"]) == [
        (PARTITION_KEY, "S"),
        (SORT_KEY, "S"),
    ]
    assert table["ttl"] == [{"attribute_name": TTL_ATTRIBUTE, "enabled": True}]
    assert table["billing_mode"] == "PAY_PER_REQUEST"
    assert table.get("read_capacity") in (None, 0) and table.get("write_capacity") in (None, 0)
    assert table["point_in_time_recovery"][0]["enabled"] is True
    assert table["deletion_protection_enabled"] is True
    assert table["server_side_encryption"] == [{"enabled": False}]  # AWS-owned key
    assert table["global_secondary_index"] == [] and table["local_secondary_index"] == []

    custom = _resources(rendered, "table_custom")["aws_dynamodb_table.this"]
    assert (custom["billing_mode"], custom["read_capacity"], custom["write_capacity"]) == (
        "PROVISIONED",
        5,
        6,
    )
    assert custom["server_side_encryption"] == [{"enabled": True, "kms_key_arn": TABLE_KEY_ARN}]
    assert custom["point_in_time_recovery"][0]["enabled"] is False
    assert custom["deletion_protection_enabled"] is False


def test_example_plans(tmp_path: Path) -> None:
    """examples/basic plans with example.tfvars and the cross-account option (dummy credentials
    merged into its provider blocks through an override file)."""
    terraform, plugin_dir = _require_terraform()
    assert plugin_dir is not None
    # A copy of its own: the override file must not leak into the other tests' copy.
    copy = tmp_path / "infra"
    shutil.copytree(INFRA_DIR, copy, ignore=shutil.ignore_patterns(".terraform*", "*.tfstate*"))
    example = copy / "examples" / "basic"
    fake = FAKE_PROVIDER.replace(f'  region                      = "{REGION}"\n', "")
    stream_account = fake.replace(
        'provider "aws" {', 'provider "aws" {\n  alias = "stream_account"'
    )
    (example / "zz_test_override.tf").write_text(fake + stream_account)
    (example / "zz_test.tfvars").write_text(
        "cross_account = {\n"
        f'  external_id         = "{EXTERNAL_ID}"\n'
        f'  consumer_principals = ["arn:aws:iam::{CONSUMER_ACCOUNT}:role/orders-etl-task"]\n'
        "}\n"
    )
    _init(terraform, plugin_dir, example)
    _run(
        [
            terraform,
            "plan",
            "-input=false",
            "-no-color",
            "-refresh=false",
            "-out=plan.bin",
            "-var-file=example.tfvars",
            "-var-file=zz_test.tfvars",
        ],
        example,
    )
    plan = json.loads(_run([terraform, "show", "-json", "plan.bin"], example).stdout)
    created = {
        change["address"]
        for change in plan["resource_changes"]
        if change["mode"] == "managed" and change["change"]["actions"] == ["create"]
    }
    assert created == {
        "module.state_table.aws_dynamodb_table.this",
        "module.consumer_policy.aws_iam_policy.this[0]",
        "aws_iam_role_policy_attachment.consumer[0]",
        "module.reader_role[0].aws_iam_role.this",
        "module.reader_role[0].aws_iam_role_policy.kinesis_read",
    }
    changes = {c["address"]: c["change"]["after"] for c in plan["resource_changes"]}
    role = changes["module.reader_role[0].aws_iam_role.this"]
    (trust,) = _statements(role["assume_role_policy"])
    assert trust["Condition"] == {"StringEquals": {"sts:ExternalId": EXTERNAL_ID}}
    read = _statements(changes["module.reader_role[0].aws_iam_role_policy.kinesis_read"]["policy"])
    assert sorted(as_list(read[0]["Resource"])) == sorted(
        [
            "arn:aws:kinesis:eu-west-1:111111111111:stream/orders",
            "arn:aws:kinesis:eu-west-1:111111111111:stream/payments",
        ]
    )


def test_multi_account_example_plans(tmp_path: Path) -> None:
    """examples/multi-account plans with its example.tfvars: one app reading `orders` in two
    regions of its account directly and in another account through that account's role."""
    terraform, plugin_dir = _require_terraform()
    assert plugin_dir is not None
    copy = tmp_path / "infra"
    shutil.copytree(INFRA_DIR, copy, ignore=shutil.ignore_patterns(".terraform*", "*.tfstate*"))
    example = copy / "examples" / "multi-account"
    fake = FAKE_PROVIDER.replace(f'  region                      = "{REGION}"\n', "")
    account_b = fake.replace(
        'provider "aws" {', 'provider "aws" {\n  alias   = "account_b"\n  profile = null'
    )
    (example / "zz_test_override.tf").write_text(fake + account_b)
    _init(terraform, plugin_dir, example)
    _run(
        [
            terraform,
            "plan",
            "-input=false",
            "-no-color",
            "-refresh=false",
            "-out=plan.bin",
            "-var-file=example.tfvars",
        ],
        example,
    )
    plan = json.loads(_run([terraform, "show", "-json", "plan.bin"], example).stdout)
    changes = {
        c["address"]: c["change"]["after"]
        for c in plan["resource_changes"]
        if c["mode"] == "managed" and c["change"]["actions"] == ["create"]
    }
    assert set(changes) == {
        "module.state_table.aws_dynamodb_table.this",
        "module.consumer_policy.aws_iam_policy.this[0]",
        "aws_iam_role_policy_attachment.consumer[0]",
        "module.reader_role_b.aws_iam_role.this",
        "module.reader_role_b.aws_iam_role_policy.kinesis_read",
    }
    home, account_b_ = "123456789012", "111111111111"  # as in example.tfvars
    assert changes["aws_iam_role_policy_attachment.consumer[0]"]["role"] == "orders-etl-task"
    # The consumer policy names the table and B's role, both known only after apply: its
    # statements for streams of two regions and a role are checked in the rendered layer
    # (test_rendered_consumer_policy_across_regions).
    assert changes["module.reader_role_b.aws_iam_role.this"]["name"] == "kinesumer-reader"
    (trust,) = _statements(changes["module.reader_role_b.aws_iam_role.this"]["assume_role_policy"])
    assert trust["Sid"] == f"KinesumerConsumers{home}"
    assert as_list(trust["Principal"]["AWS"]) == [f"arn:aws:iam::{home}:role/orders-etl-task"]
    assert trust["Condition"] == {"StringEquals": {"sts:ExternalId": "orders-etl-7c1f"}}
    (read,) = _statements(
        changes["module.reader_role_b.aws_iam_role_policy.kinesis_read"]["policy"]
    )
    assert as_list(read["Resource"]) == [f"arn:aws:kinesis:us-east-1:{account_b_}:stream/orders"]
    assert set(as_list(read["Action"])) == KINESIS_READ_ACTIONS


# Inputs the variables' validations must refuse:
# (module call, module, inputs, variable at fault, start of the error message).
BAD_INPUTS: list[tuple[str, str, dict[str, Any], str, str]] = [
    (
        "mode",
        "state-table",
        {"name": "bad-mode", "billing_mode": "ON_DEMAND"},
        "billing_mode",
        "billing_mode must be PAY_PER_REQUEST or PROVISIONED",
    ),
    (
        "no_capacity",
        "state-table",
        {"name": "no-capacity", "billing_mode": "PROVISIONED", "write_capacity": 5},
        "read_capacity",
        "read_capacity must be a whole number >= 1 when billing_mode is PROVISIONED",
    ),
    (
        "stray_capacity",
        "state-table",
        {"name": "stray-capacity", "write_capacity": 5},
        "write_capacity",
        "write_capacity must be a whole number >= 1 when billing_mode is PROVISIONED",
    ),
    (
        "bad_key",
        "state-table",
        {"name": "bad-key", "kms_key_arn": "alias/aws/dynamodb"},
        "kms_key_arn",
        "kms_key_arn must be null or a KMS key ARN",
    ),
    (
        "wild_stream",
        "consumer-policy",
        {
            "apps": [APP],
            "table_arn": TABLE_ARN,
            "stream_arns": [f"arn:aws:kinesis:{REGION}:{CONSUMER_ACCOUNT}:stream/*"],
        },
        "stream_arns",
        "Each stream_arns entry must be a full Kinesis stream ARN",
    ),
    (
        "wild_table",
        "consumer-policy",
        {
            "apps": [APP],
            "table_arn": f"arn:aws:dynamodb:{REGION}:{CONSUMER_ACCOUNT}:table/*",
            "stream_arns": STREAM_ARNS,
        },
        "table_arn",
        "table_arn must be a full DynamoDB table ARN",
    ),
    (
        "nothing_to_read",
        "consumer-policy",
        {"apps": [APP], "table_arn": TABLE_ARN},
        "assume_role_arns",
        "Give at least one of stream_arns",
    ),
    (
        "efo_without_consumer_name",
        "consumer-policy",
        {
            "apps": [APP],
            "table_arn": TABLE_ARN,
            "stream_arns": STREAM_ARNS,
            "enhanced_fan_out": True,
        },
        "consumer_name",
        "enhanced_fan_out = true needs consumer_name",
    ),
    (
        "no_apps",
        "consumer-policy",
        {"apps": [], "table_arn": TABLE_ARN, "stream_arns": STREAM_ARNS},
        "apps",
        "apps must name at least one kinesumer app",
    ),
    (
        "wild_app",
        "consumer-policy",
        {"apps": ["orders*"], "table_arn": TABLE_ARN, "stream_arns": STREAM_ARNS},
        "apps",
        "Each apps entry must be an app name as Config accepts it",
    ),
    (
        "app_with_separator",
        "consumer-policy",
        {"apps": ["orders#x"], "table_arn": TABLE_ARN, "stream_arns": STREAM_ARNS},
        "apps",
        "Each apps entry must be an app name as Config accepts it",
    ),
    (
        "app_of_a_spark_query",
        "consumer-policy",
        {"apps": ["orders.spark-x"], "table_arn": TABLE_ARN, "stream_arns": STREAM_ARNS},
        "apps",
        'apps must not contain ".spark-"',
    ),
    (
        "stream_keys_without_streams",
        "consumer-policy",
        {
            "apps": [APP],
            "table_arn": TABLE_ARN,
            "assume_role_arns": [READER_ROLE_ARN],
            "stream_kms_key_arns": [STREAM_KEY_ARN],
        },
        "stream_kms_key_arns",
        "stream_kms_key_arns needs stream_arns",
    ),
    (
        "dead_letter_keys_without_streams",
        "consumer-policy",
        {
            "apps": [APP],
            "table_arn": TABLE_ARN,
            "stream_arns": STREAM_ARNS,
            "dead_letter_stream_kms_key_arns": [DEAD_LETTER_KEY_ARN],
        },
        "dead_letter_stream_kms_key_arns",
        "dead_letter_stream_kms_key_arns needs dead_letter_stream_arns",
    ),
    (
        "empty_external_id",
        "cross-account-role",
        {
            "name": "r1",
            "external_id": "",
            "consumer_principals": [CONSUMER_ROLE_ARN],
            "stream_arns": [REMOTE_STREAM_ARN],
        },
        "external_id",
        "external_id must be non-empty",
    ),
    (
        "wild_principal",
        "cross-account-role",
        {
            "name": "r2",
            "external_id": EXTERNAL_ID,
            "consumer_principals": ["*"],
            "stream_arns": [REMOTE_STREAM_ARN],
        },
        "consumer_principals",
        "Each consumer_principals entry must be an IAM role or user ARN",
    ),
    (
        "bare_account",
        "cross-account-role",
        {
            "name": "r4",
            "external_id": EXTERNAL_ID,
            "consumer_principals": [CONSUMER_ACCOUNT],
            "stream_arns": [REMOTE_STREAM_ARN],
        },
        "consumer_principals",
        "Each consumer_principals entry must be an IAM role or user ARN",
    ),
    (
        "root_principal",
        "cross-account-role",
        {
            "name": "r5",
            "external_id": EXTERNAL_ID,
            "consumer_principals": [f"arn:aws:iam::{CONSUMER_ACCOUNT}:root"],
            "stream_arns": [REMOTE_STREAM_ARN],
        },
        "consumer_principals",
        "Each consumer_principals entry must be an IAM role or user ARN",
    ),
    (
        "pattern_any_account",
        "cross-account-role",
        {
            "name": "r6",
            "external_id": EXTERNAL_ID,
            "consumer_principal_arn_patterns": ["arn:aws:iam::*:role/orders-etl"],
            "stream_arns": [REMOTE_STREAM_ARN],
        },
        "consumer_principal_arn_patterns",
        "Each consumer_principal_arn_patterns entry must be an IAM role ARN pattern",
    ),
    (
        "pattern_any_role",
        "cross-account-role",
        {
            "name": "r7",
            "external_id": EXTERNAL_ID,
            "consumer_principal_arn_patterns": [f"arn:aws:iam::{CONSUMER_ACCOUNT}:role/*"],
            "stream_arns": [REMOTE_STREAM_ARN],
        },
        "consumer_principal_arn_patterns",
        "Each consumer_principal_arn_patterns entry must be an IAM role ARN pattern",
    ),
    (
        "nobody_trusted",
        "cross-account-role",
        {"name": "r8", "external_id": EXTERNAL_ID, "stream_arns": [REMOTE_STREAM_ARN]},
        "consumer_principal_arn_patterns",
        "Give at least one of consumer_principals",
    ),
    (
        "consumer_account_id",
        "cross-account-role",
        {
            "name": "r9",
            "external_id": EXTERNAL_ID,
            # (its principal is of that "account": only the key is at fault)
            "consumer_accounts": {"1111": {"principals": ["arn:aws:iam::1111:role/orders-etl"]}},
            "stream_arns": [REMOTE_STREAM_ARN],
        },
        "consumer_accounts",
        "Each consumer_accounts key must be a 12-digit AWS account id",
    ),
    (
        "consumer_account_whole",
        "cross-account-role",
        {
            "name": "r10",
            "external_id": EXTERNAL_ID,
            "consumer_accounts": {CONSUMER_ACCOUNT: {}},
            "stream_arns": [REMOTE_STREAM_ARN],
        },
        "consumer_accounts",
        "Each consumer_accounts entry must name principals or principal_arn_patterns",
    ),
    (
        "consumer_account_other_principal",
        "cross-account-role",
        {
            "name": "r11",
            "external_id": EXTERNAL_ID,
            "consumer_accounts": {THIRD_ACCOUNT: {"principals": [CONSUMER_ROLE_ARN]}},
            "stream_arns": [REMOTE_STREAM_ARN],
        },
        "consumer_accounts",
        "Each consumer_accounts principals entry must be an IAM role or user ARN of that entry",
    ),
    (
        "consumer_account_root",
        "cross-account-role",
        {
            "name": "r12",
            "external_id": EXTERNAL_ID,
            "consumer_accounts": {
                CONSUMER_ACCOUNT: {"principals": [f"arn:aws:iam::{CONSUMER_ACCOUNT}:root"]}
            },
            "stream_arns": [REMOTE_STREAM_ARN],
        },
        "consumer_accounts",
        "Each consumer_accounts principals entry must be an IAM role or user ARN of that entry",
    ),
    (
        "consumer_account_any_role",
        "cross-account-role",
        {
            "name": "r13",
            "external_id": EXTERNAL_ID,
            "consumer_accounts": {
                CONSUMER_ACCOUNT: {
                    "principal_arn_patterns": [f"arn:aws:iam::{CONSUMER_ACCOUNT}:role/*"]
                }
            },
            "stream_arns": [REMOTE_STREAM_ARN],
        },
        "consumer_accounts",
        "Each consumer_accounts principal_arn_patterns entry must be an IAM role ARN pattern",
    ),
    (
        "consumer_account_bad_external_id",
        "cross-account-role",
        {
            "name": "r14",
            "external_id": EXTERNAL_ID,
            "consumer_accounts": {
                CONSUMER_ACCOUNT: {"principals": [CONSUMER_ROLE_ARN], "external_id": "x"}
            },
            "stream_arns": [REMOTE_STREAM_ARN],
        },
        "consumer_accounts",
        "Each consumer_accounts external_id must be null or 2-1224 characters",
    ),
    (
        "missing_external_id",
        "cross-account-role",
        {
            "name": "r15",
            "consumer_accounts": {
                CONSUMER_ACCOUNT: {"principals": [CONSUMER_ROLE_ARN], "external_id": "ok-id"},
                THIRD_ACCOUNT: {"principal_arn_patterns": [THIRD_ROLE_PATTERN]},
            },
            "stream_arns": [REMOTE_STREAM_ARN],
        },
        "external_id",
        "external_id is required with consumer_principals",
    ),
    (
        "missing_external_id_for_principals",
        "cross-account-role",
        {
            "name": "r16",
            "consumer_principals": [CONSUMER_ROLE_ARN],
            "stream_arns": [REMOTE_STREAM_ARN],
        },
        "external_id",
        "external_id is required with consumer_principals",
    ),
    (
        "role_reads_nothing",
        "cross-account-role",
        {"name": "r17", "external_id": EXTERNAL_ID, "consumer_principals": [CONSUMER_ROLE_ARN]},
        "stream_arns",
        "Give at least one of stream_arns, stream_names or table_stream_arns",
    ),
    (
        "stream_name_wildcard",
        "cross-account-role",
        {
            "name": "r18",
            "external_id": EXTERNAL_ID,
            "consumer_principals": [CONSUMER_ROLE_ARN],
            "stream_names": {REGION: ["orders*"]},
        },
        "stream_names",
        "Each stream_names entry must be a stream name",
    ),
    (
        "stream_names_region",
        "cross-account-role",
        {
            "name": "r19",
            "external_id": EXTERNAL_ID,
            "consumer_principals": [CONSUMER_ROLE_ARN],
            "stream_names": {"*": ["orders"]},
        },
        "stream_names",
        "Each stream_names key must be an AWS region name",
    ),
    (
        "role_table_stream_wildcard",
        "cross-account-role",
        {
            "name": "r20",
            "external_id": EXTERNAL_ID,
            "consumer_principals": [CONSUMER_ROLE_ARN],
            "table_stream_arns": [
                f"arn:aws:dynamodb:{REGION}:{STREAM_ACCOUNT}:table/orders/stream/*"
            ],
        },
        "table_stream_arns",
        "Each table_stream_arns entry must be a full DynamoDB table stream ARN",
    ),
    (
        "role_key_of_another_region",
        "cross-account-role",
        {
            "name": "r21",
            "external_id": EXTERNAL_ID,
            "consumer_principals": [CONSUMER_ROLE_ARN],
            "stream_arns": REMOTE_REGION_STREAM_ARNS,
            "stream_kms_keys": {REMOTE_REGION_STREAM_ARNS[0]: REMOTE_REGION_KEY_ARNS[1]},
        },
        "stream_kms_keys",
        "Each stream_kms_keys value must be a KMS key ARN",
    ),
    (
        "policy_key_of_unread_stream",
        "consumer-policy",
        {
            "apps": [APP],
            "table_arn": TABLE_ARN,
            "stream_arns": REGION_STREAM_ARNS[:1],
            "stream_kms_keys": {REGION_STREAM_ARNS[1]: REGION_KEY_ARNS[1]},
        },
        "stream_kms_keys",
        "Each stream_kms_keys key must be one of stream_arns",
    ),
    (
        "policy_key_alias",
        "consumer-policy",
        {
            "apps": [APP],
            "table_arn": TABLE_ARN,
            "stream_arns": REGION_STREAM_ARNS,
            "stream_kms_keys": {REGION_STREAM_ARNS[0]: "alias/orders"},
        },
        "stream_kms_keys",
        "Each stream_kms_keys value must be a KMS key ARN",
    ),
    (
        "policy_table_not_stream",
        "consumer-policy",
        {
            "apps": [APP],
            "table_arn": TABLE_ARN,
            "table_stream_arns": [TABLE_ARN],
        },
        "table_stream_arns",
        "Each table_stream_arns entry must be a full DynamoDB table stream ARN",
    ),
    (
        "long_session",
        "cross-account-role",
        {
            "name": "r3",
            "external_id": EXTERNAL_ID,
            "consumer_principals": [CONSUMER_ROLE_ARN],
            "stream_arns": [REMOTE_STREAM_ARN],
            "max_session_duration": 86400,
        },
        "max_session_duration",
        "max_session_duration must be a whole number of seconds",
    ),
]


def _plan_errors(
    terraform: str, plugin_dir: Path, root: Path, cases: list[tuple[str, str, dict[str, Any]]]
) -> dict[str, list[str]]:
    """Plan a root calling modules with the given (call, module, inputs); {call: [error details]}.

    Module sources are absolute paths, which Terraform copies to .terraform/modules/<call>/: the
    "checked by the validation rule at ..." part of each error then names the module call.
    """
    if root.exists():
        shutil.rmtree(root)
    root.mkdir()
    calls = []
    for call, module, inputs in cases:
        args = "\n".join(f"  {k} = {json.dumps(v)}" for k, v in inputs.items())
        source = (root.parent / "modules" / module).as_posix()
        calls.append(f'module "{call}" {{\n  source = "{source}"\n{args}\n}}\n')
    (root / "main.tf").write_text(FAKE_PROVIDER + "\n".join(calls))
    _init(terraform, plugin_dir, root)
    proc = _run(
        [terraform, "plan", "-input=false", "-no-color", "-refresh=false", "-json"],
        root,
        check=False,
    )
    errors: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        diagnostic = json.loads(line).get("diagnostic") or {}
        if diagnostic.get("severity") != "error":
            continue
        detail = " ".join(diagnostic.get("detail", "").split())
        where = re.search(r"\.terraform/modules/([^/]+)/", detail)
        errors.setdefault(where.group(1) if where else "?", []).append(detail)
    if not errors:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return errors


@pytest.fixture(scope="session")
def rejected(infra_copy: Path) -> dict[str, list[str]]:
    """{module call: [error details]} for BAD_INPUTS.

    Terraform checks validations that refer only to their own variable while validating, and
    those that refer to other variables during the plan walk, which it does not reach when the
    first kind already failed. So cases that reported nothing are planned again on their own
    until a round brings no new error.
    """
    terraform, plugin_dir = _require_terraform()
    assert plugin_dir is not None
    pending = [(call, module, inputs) for call, module, inputs, _v, _m in BAD_INPUTS]
    found: dict[str, list[str]] = {}
    for round_ in range(1, len(pending) + 1):
        errors = _plan_errors(terraform, plugin_dir, infra_copy / f"_rejected{round_}", pending)
        found.update(errors)
        pending = [case for case in pending if case[0] not in errors]
        if not errors or not pending:
            break
    return found


@pytest.mark.parametrize(
    ("call", "message"),
    [(c, m) for c, _mod, _in, _v, m in BAD_INPUTS],
    ids=[c for c, *_ in BAD_INPUTS],
)
def test_validation_rejects(rejected: dict[str, list[str]], call: str, message: str) -> None:
    messages = rejected.get(call, [])
    assert messages, f"module.{call} was accepted; errors of the other calls: {rejected}"
    # Exactly the intended validation fired, not some other one.
    assert all(m.startswith(message) for m in messages), messages


def test_consumer_runs_on_the_table_terraform_declares(
    moto_url: str, unique_name: Callable[[str], str]
) -> None:
    """The table built from the parsed HCL (not from the library's own create_state_table) is
    one the consumer group runs on: join, read, checkpoint, resume."""
    import boto3
    from support.group import create_stream, make_config, put

    from kinesumer import Kinesumer

    table, stream = unique_name("tf-state"), unique_name("s")
    dynamodb = boto3.client("dynamodb", endpoint_url=moto_url, region_name="us-east-1")
    create_table_from_terraform(dynamodb, table, variables={"deletion_protection": False})
    create_stream(moto_url, stream, 2)
    produced = put(moto_url, stream, 0, 40)
    config = make_config(moto_url, moto_url, unique_name("app"), table)
    got = []
    for _ in range(2):  # the second run resumes from the checkpoints written in the first
        with Kinesumer(config) as consumer:
            for record in consumer.consume([stream]):
                got.append(record.data)
                if len(got) in (25, 40):
                    break
    assert sorted(got) == sorted(produced)
    items = dynamodb.scan(TableName=table)["Items"]
    assert {i["pk"]["S"].split("#")[0] for i in items} >= {"check_point", "shard_cache"}


# --- the state table: each app's own keys only (dynamodb:LeadingKeys) --------------------------


def _iam_string_like(pattern: str, value: str) -> bool:
    """IAM's StringLike: ``*`` any run of characters, ``?`` one, case-sensitive."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, re.DOTALL) is not None


def _partition_key_forms() -> dict[str, bool]:
    """Every partition key form the library writes for an app, found by reading kinesumer/:
    ``{prefix: has more after the app}`` for each f-string ``"<prefix>#{app}..."``."""
    forms: dict[str, bool] = {}
    for path in sorted((REPO_ROOT / "kinesumer").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.JoinedStr) or len(node.values) < 2:
                continue
            head, second = node.values[0], node.values[1]
            if (
                isinstance(head, ast.Constant)
                and isinstance(head.value, str)
                and re.fullmatch(r"[a-z_]+#", head.value)
                and isinstance(second, ast.FormattedValue)
                and isinstance(second.value, ast.Name)
                and second.value.id == "app"
            ):
                forms[head.value[:-1]] = len(node.values) > 2
    return forms


from kinesumer.spark.source.driver.groups import group_of  # noqa: E402  (beside its pk functions)


def _library_partition_keys(app: str) -> list[str]:
    """The partition keys of app ``app``'s items, made by the library's own functions."""
    from kinesumer.statestore.dynamodb.controls import controls_key, load_pk, weights_key
    from kinesumer.statestore.dynamodb.positions import broadcast_pk
    from kinesumer.statestore.dynamodb.spark import ledger_pk, pins_pk
    from kinesumer.statestore.dynamodb.view import view_pk
    from kinesumer.statestore.schema import checkpoint_pk, client_pk, shard_cache_pk

    return [
        client_pk(app),
        shard_cache_pk(app),
        checkpoint_pk(app, "orders"),
        checkpoint_pk(app, "a.b-c_d"),
        view_pk(app),
        controls_key(app)[PARTITION_KEY]["S"],
        weights_key(app)[PARTITION_KEY]["S"],
        load_pk(app),
        broadcast_pk(app, "host-1-abc123"),
        ledger_pk(app, "q1"),
        pins_pk(app),
    ]


def test_every_partition_key_form_is_known() -> None:
    """The scan finds the forms the library functions make, and no other (a new item kind fails
    here until the consumer policy's app_partitions lists it)."""
    forms = _partition_key_forms()
    made = {pk.split("#")[0] for pk in _library_partition_keys(APP)}
    assert set(forms) == made, (sorted(forms), sorted(made))
    assert {name for name, more in forms.items() if more} == {
        "check_point",
        "broadcast",
        "spark_ledger",
    }


def test_rendered_state_table_access_is_limited_to_the_apps_keys(rendered: dict[str, Any]) -> None:
    statements = {s["Sid"]: s for s in _statements(_output(rendered, "policy"))}
    table = statements["StateTable"]
    assert table["Condition"]["Null"] == {"dynamodb:LeadingKeys": "false"}
    patterns = as_list(table["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"])
    # Exactly one pattern per item kind: "<kind>#<app>", or "<kind>#<app>#*" for kinds keyed
    # further (by stream, client id or query).
    forms = _partition_key_forms()
    own = [f"{kind}#{APP}#*" if more else f"{kind}#{APP}" for kind, more in forms.items()]
    # ... and each kind a Spark query's own group keeps, under "<app>.spark-<query>".
    group_kinds = [kind for kind in forms if kind not in ("broadcast", "spark_ledger")]
    assert sorted(patterns) == sorted(own + [f"{kind}#{APP}.spark-*" for kind in group_kinds])
    # Every key the library makes for the app, or for one of its queries' groups, is admitted ...
    query_group = group_of(APP, "5f0c9a1e-query", shared=False)
    group_keys = [
        pk for pk in _library_partition_keys(query_group) if pk.split("#")[0] in group_kinds
    ]
    for pk in _library_partition_keys(APP) + group_keys:
        assert any(_iam_string_like(p, pk) for p in patterns), pk
    # ... and none of another app's, not even one whose name starts with this app's.
    for other in (f"{APP}2", f"{APP}-v2", APP[:-1], APP.upper(), "billing"):
        for pk in _library_partition_keys(other):
            assert not any(_iam_string_like(p, pk) for p in patterns), (other, pk)
    # The table call names no item: it has a statement of its own, without keys.
    describe = statements["StateTableDescribe"]
    assert as_list(describe["Action"]) == ["dynamodb:DescribeTable"]
    assert "Condition" not in describe


def test_iam_string_like() -> None:
    assert _iam_string_like("check_point#a#*", "check_point#a#orders")
    assert _iam_string_like("check_point#a#*", "check_point#a#")
    assert not _iam_string_like("check_point#a#*", "check_point#ab#orders")
    assert not _iam_string_like("client#a", "client#a2")
    assert _iam_string_like("client#?", "client#a") and not _iam_string_like("client#?", "client#")
