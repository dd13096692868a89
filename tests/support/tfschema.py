"""Read the Terraform in ``infra/`` with python-hcl2, so tests use what Terraform would create.

``create_table_from_terraform`` builds the kinesumer state table in a DynamoDB API (moto) from
the parsed ``infra/modules/state-table`` definition rather than from values copied into the
tests: if the Terraform and ``kinesumer.statestore.schema`` drift apart, the tests that run a
consumer on this table notice.

Only what the module states is used. The schema parts (keys, attribute definitions, TTL attribute)
must be literals in the HCL; settings may be literals or plain ``var.NAME`` references, resolved
from the module's variable defaults and the ``variables`` you pass (as a module caller would).
Anything else raises ``TerraformParseError`` instead of being guessed.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hcl2

from kinesumer.statestore.schema import PARTITION_KEY, SORT_KEY, TTL_ATTRIBUTE

REPO_ROOT = Path(__file__).resolve().parents[2]
INFRA_DIR = REPO_ROOT / "infra"
STATE_TABLE_DIR = INFRA_DIR / "modules" / "state-table"

_REQUIRED = object()
_VAR_RE = re.compile(r"^\$\{var\.([A-Za-z_][A-Za-z0-9_-]*)\}$")
_VAR_NULL_TEST_RE = re.compile(r"^\$\{var\.([A-Za-z_][A-Za-z0-9_-]*) (==|!=) null\}$")
_LOCAL_RE = re.compile(r"^\$\{local\.([A-Za-z_][A-Za-z0-9_-]*)\}$")


class TerraformParseError(ValueError):
    """The HCL does not have the shape these helpers rely on."""


# --- loading --------------------------------------------------------------------------------------


def _serialization_options() -> Any:
    # python-hcl2 >= 8 keeps the quotes around strings and wraps blocks unless told otherwise
    # (older releases had no SerializationOptions and returned the plain form). Only the options
    # the installed release knows are passed.
    options_cls = getattr(hcl2, "SerializationOptions", None)
    if options_cls is None:
        return None
    wanted = {"strip_string_quotes": True, "explicit_blocks": False, "with_comments": False}
    accepted = inspect.signature(options_cls).parameters
    return options_cls(**{k: v for k, v in wanted.items() if k in accepted})


def load_hcl(path: Path) -> dict[str, Any]:
    """Parse one ``.tf`` file into python-hcl2's dict form."""
    options = _serialization_options()
    with open(path, encoding="utf-8") as f:
        if options is None:
            parsed: dict[str, Any] = hcl2.load(f)
        else:
            parsed = hcl2.load(f, serialization_options=options)
    return parsed


def load_module(module_dir: Path) -> dict[str, list[Any]]:
    """Parse every ``*.tf`` file of a module and merge them by top-level block type.

    Terraform treats all files of a directory as one module, so ``resource``, ``variable`` ...
    lists from every file are concatenated.
    """
    files = sorted(Path(module_dir).glob("*.tf"))
    if not files:
        raise TerraformParseError(f"no .tf files in {module_dir}")
    merged: dict[str, list[Any]] = {}
    for path in files:
        for key, value in load_hcl(path).items():
            if key.startswith("__"):  # comments / metadata
                continue
            merged.setdefault(key, []).extend(value if isinstance(value, list) else [value])
    return merged


def labelled_blocks(module: Mapping[str, list[Any]], kind: str, type_: str) -> dict[str, Any]:
    """``{name: body}`` of e.g. every ``resource "aws_dynamodb_table" NAME`` in a module."""
    found: dict[str, Any] = {}
    for entry in module.get(kind, []):
        for name, body in entry.get(type_, {}).items():
            found[name] = body
    return found


def module_variables(module: Mapping[str, list[Any]]) -> dict[str, Any]:
    """``{name: spec}`` of the module's variables."""
    variables: dict[str, Any] = {}
    for entry in module.get("variable", []):
        variables.update(entry)
    return variables


def module_locals(module: Mapping[str, list[Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for entry in module.get("locals", []):
        result.update(entry)
    return result


def single_block(body: Mapping[str, Any], name: str) -> dict[str, Any]:
    """A nested block that must appear exactly once (``ttl {}``, ``point_in_time_recovery {}``)."""
    blocks = body.get(name)
    if blocks is None:
        raise TerraformParseError(f"missing {name} block")
    if isinstance(blocks, dict):
        return blocks
    if len(blocks) != 1:
        raise TerraformParseError(f"expected one {name} block, found {len(blocks)}")
    return blocks[0]  # type: ignore[no-any-return]


# --- expression resolution ------------------------------------------------------------------------


class _Resolver:
    """Evaluates the few expression forms the modules use for settings; refuses the rest."""

    def __init__(self, module: Mapping[str, list[Any]], overrides: Mapping[str, Any]) -> None:
        declared = module_variables(module)
        unknown = set(overrides) - set(declared)
        if unknown:
            raise TerraformParseError(f"module has no variable(s) {sorted(unknown)}")
        self.values: dict[str, Any] = {}
        for name, spec in declared.items():
            self.values[name] = overrides.get(name, spec.get("default", _REQUIRED))

    def var(self, name: str) -> Any:
        if name not in self.values:
            raise TerraformParseError(f"reference to undeclared variable var.{name}")
        value = self.values[name]
        if value is _REQUIRED:
            raise TerraformParseError(f"variable {name} has no default and was not given")
        return value

    def __call__(self, value: Any, what: str) -> Any:
        if not isinstance(value, str) or "${" not in value:
            return value
        if m := _VAR_RE.match(value):
            return self.var(m.group(1))
        if m := _VAR_NULL_TEST_RE.match(value):
            is_null = self.var(m.group(1)) is None
            return is_null if m.group(2) == "==" else not is_null
        raise TerraformParseError(f"{what}: cannot evaluate {value!r}")


def literal(value: Any, what: str) -> Any:
    """A value that must be written literally in the HCL (schema parts: keys, attribute types)."""
    if isinstance(value, str) and "${" in value:
        raise TerraformParseError(f"{what} must be a literal, found expression {value!r}")
    return value


def resolve_locals(value: Any, module: Mapping[str, list[Any]]) -> Any:
    """Replace a whole-value ``${local.NAME}`` reference by the local's (literal) value."""
    if isinstance(value, str) and (m := _LOCAL_RE.match(value)):
        locals_ = module_locals(module)
        if m.group(1) not in locals_:
            raise TerraformParseError(f"reference to undeclared local.{m.group(1)}")
        return locals_[m.group(1)]
    return value


# --- the state table ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TableDefinition:
    """The parsed ``aws_dynamodb_table`` of the state-table module, settings resolved."""

    hash_key: str
    range_key: str | None
    attributes: dict[str, str]  # attribute definitions: name -> S/N/B
    ttl_attribute: str | None
    ttl_enabled: bool
    billing_mode: str
    read_capacity: int | None
    write_capacity: int | None
    point_in_time_recovery: bool
    deletion_protection: bool
    sse_enabled: bool
    kms_key_arn: str | None
    secondary_indexes: tuple[str, ...]  # block names of any GSI/LSI (should be empty)


def table_definition(
    module_dir: Path = STATE_TABLE_DIR,
    variables: Mapping[str, Any] | None = None,
) -> TableDefinition:
    """Parse the one ``aws_dynamodb_table`` of a module (default ``infra/modules/state-table``).

    ``variables`` are module inputs (e.g. ``{"name": "t", "billing_mode": "PROVISIONED", ...}``);
    the rest come from the module's defaults. ``name`` defaults to a placeholder since only the
    caller knows the table name.
    """
    module = load_module(module_dir)
    tables = labelled_blocks(module, "resource", "aws_dynamodb_table")
    if len(tables) != 1:
        raise TerraformParseError(
            f"expected one aws_dynamodb_table in {module_dir}, found {len(tables)}"
        )
    (body,) = tables.values()
    resolve = _Resolver(module, {"name": "placeholder", **(variables or {})})

    attributes: dict[str, str] = {}
    for attr in body.get("attribute", []):
        name = literal(attr["name"], "attribute.name")
        if name in attributes:
            raise TerraformParseError(f"attribute {name!r} declared twice")
        attributes[name] = literal(attr["type"], f"attribute {name}.type")

    ttl = single_block(body, "ttl") if "ttl" in body else {}
    pitr = single_block(body, "point_in_time_recovery") if "point_in_time_recovery" in body else {}
    sse = single_block(body, "server_side_encryption") if "server_side_encryption" in body else {}

    def as_int(value: Any, what: str) -> int | None:
        value = resolve(value, what)
        return None if value is None else int(value)

    return TableDefinition(
        hash_key=literal(body["hash_key"], "hash_key"),
        range_key=literal(body.get("range_key"), "range_key"),
        attributes=attributes,
        ttl_attribute=literal(ttl.get("attribute_name"), "ttl.attribute_name"),
        ttl_enabled=bool(resolve(ttl.get("enabled", False), "ttl.enabled")),
        billing_mode=resolve(body.get("billing_mode", "PROVISIONED"), "billing_mode"),
        read_capacity=as_int(body.get("read_capacity"), "read_capacity"),
        write_capacity=as_int(body.get("write_capacity"), "write_capacity"),
        point_in_time_recovery=bool(resolve(pitr.get("enabled", False), "point_in_time_recovery")),
        deletion_protection=bool(
            resolve(body.get("deletion_protection_enabled", False), "deletion_protection_enabled")
        ),
        sse_enabled=bool(resolve(sse.get("enabled", False), "server_side_encryption.enabled")),
        kms_key_arn=resolve(sse.get("kms_key_arn"), "server_side_encryption.kms_key_arn"),
        secondary_indexes=tuple(
            k for k in ("global_secondary_index", "local_secondary_index") if body.get(k)
        ),
    )


def schema_mismatches(table: TableDefinition) -> list[str]:
    """How a parsed table differs from ``kinesumer.statestore.schema`` (empty list: it matches)."""
    problems: list[str] = []
    if table.hash_key != PARTITION_KEY:
        problems.append(f"hash_key is {table.hash_key!r}, library expects {PARTITION_KEY!r}")
    if table.range_key != SORT_KEY:
        problems.append(f"range_key is {table.range_key!r}, library expects {SORT_KEY!r}")
    expected_attributes = {PARTITION_KEY: "S", SORT_KEY: "S"}
    if table.attributes != expected_attributes:
        problems.append(
            f"attribute definitions are {table.attributes}, "
            f"library expects exactly {expected_attributes}"
        )
    if table.ttl_attribute != TTL_ATTRIBUTE:
        problems.append(
            f"TTL attribute is {table.ttl_attribute!r}, library expects {TTL_ATTRIBUTE!r}"
        )
    if not table.ttl_enabled:
        problems.append("TTL is not enabled")
    if table.secondary_indexes:
        problems.append(f"unexpected secondary indexes: {table.secondary_indexes}")
    return problems


def create_table_from_terraform(
    dynamodb_client: Any,
    table_name: str,
    *,
    variables: Mapping[str, Any] | None = None,
    module_dir: Path = STATE_TABLE_DIR,
) -> None:
    """Create ``table_name`` in a DynamoDB API the way ``infra/modules/state-table`` declares it.

    Key schema, attribute definitions, billing mode (with capacities), deletion protection and
    encryption go into CreateTable; TTL goes through UpdateTimeToLive and point-in-time recovery
    through UpdateContinuousBackups, as Terraform does. ``variables`` are module inputs; pass
    ``{"deletion_protection": False}`` for a table a test wants to delete again. Waits until the
    table is ACTIVE. (dynalite implements neither TTL nor continuous backups: use moto.)
    """
    table = table_definition(module_dir, {**(variables or {}), "name": table_name})
    key_schema = [{"AttributeName": table.hash_key, "KeyType": "HASH"}]
    if table.range_key is not None:
        key_schema.append({"AttributeName": table.range_key, "KeyType": "RANGE"})
    kwargs: dict[str, Any] = {
        "TableName": table_name,
        "KeySchema": key_schema,
        "AttributeDefinitions": [
            {"AttributeName": name, "AttributeType": type_}
            for name, type_ in table.attributes.items()
        ],
        "BillingMode": table.billing_mode,
        "DeletionProtectionEnabled": table.deletion_protection,
    }
    if table.billing_mode == "PROVISIONED":
        if table.read_capacity is None or table.write_capacity is None:
            raise TerraformParseError("PROVISIONED billing needs read_capacity and write_capacity")
        kwargs["ProvisionedThroughput"] = {
            "ReadCapacityUnits": table.read_capacity,
            "WriteCapacityUnits": table.write_capacity,
        }
    if table.sse_enabled:
        sse: dict[str, Any] = {"Enabled": True, "SSEType": "KMS"}
        if table.kms_key_arn is not None:
            sse["KMSMasterKeyId"] = table.kms_key_arn
        kwargs["SSESpecification"] = sse

    dynamodb_client.create_table(**kwargs)
    dynamodb_client.get_waiter("table_exists").wait(
        TableName=table_name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 600}
    )
    if table.ttl_attribute is not None:
        dynamodb_client.update_time_to_live(
            TableName=table_name,
            TimeToLiveSpecification={
                "Enabled": table.ttl_enabled,
                "AttributeName": table.ttl_attribute,
            },
        )
    if table.point_in_time_recovery:
        dynamodb_client.update_continuous_backups(
            TableName=table_name,
            PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": True},
        )


# --- IAM policy documents -------------------------------------------------------------------------


def policy_statements(module_dir: Path, document: str) -> Iterator[dict[str, Any]]:
    """Every ``statement`` (plain and ``dynamic "statement"`` content) of a policy document data
    source, with whole-value ``local.*`` references replaced by the local's value."""
    module = load_module(module_dir)
    documents = labelled_blocks(module, "data", "aws_iam_policy_document")
    if document not in documents:
        raise TerraformParseError(f"no data.aws_iam_policy_document.{document} in {module_dir}")
    body = documents[document]
    statements: list[dict[str, Any]] = list(body.get("statement", []))
    for dynamic in body.get("dynamic", []):
        for label, spec in dynamic.items():
            if label != "statement":
                continue
            content = spec["content"]
            statements.extend(content if isinstance(content, list) else [content])
    for statement in statements:
        yield {key: resolve_locals(value, module) for key, value in statement.items()}
