"""infra/modules/producer-policy: what a Producer, and so an outbox relay, may do in AWS.

Parsed HCL (python-hcl2): exactly the Kinesis calls the producer makes (a scan of
``kinesumer/producer/`` finds them), on the named streams only, KMS only through Kinesis and
for those streams; the variable refuses wildcards. ``tests/infra/test_infra.py`` validates the
module with terraform (its TERRAFORM_DIRS).
"""

from __future__ import annotations

import re
from typing import Any

from support.aws_calls import CLIENT_NAMES, library_calls
from support.tfschema import INFRA_DIR, load_module, module_variables, policy_statements

MODULE = INFRA_DIR / "modules" / "producer-policy"


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def producer_calls() -> set[str]:
    """The AWS calls in kinesumer/producer/ (through its Kinesis transport, which
    producer/limits.py names ``kinesis``)."""
    return set(library_calls(["producer"], receivers={**CLIENT_NAMES, "kinesis": "kinesis"}))


def test_the_policy_grants_the_producers_calls_on_the_named_streams_only() -> None:
    statements = {s["sid"]: s for s in policy_statements(MODULE, "this")}
    assert set(statements) == {"KinesisPut", "StreamKeys"}
    put = statements["KinesisPut"]
    expected = {"kinesis:PutRecords", "kinesis:ListShards", "kinesis:DescribeStreamSummary"}
    assert set(put["actions"]) == producer_calls() == expected
    assert as_list(put["resources"]) == ["${sort(distinct(var.stream_arns))}"]
    keys = statements["StreamKeys"]
    assert keys["actions"] == ["kms:GenerateDataKey"]
    conditions = {c["variable"]: c["values"] for c in keys["condition"]}
    assert set(conditions) == {"kms:ViaService", "kms:EncryptionContext:aws:kinesis:arn"}
    assert (
        conditions["kms:EncryptionContext:aws:kinesis:arn"] == "${sort(distinct(var.stream_arns))}"
    )


def test_stream_arns_must_be_full_arns_without_wildcards() -> None:
    spec = module_variables(load_module(MODULE))["stream_arns"]
    condition = next(v["condition"] for v in spec["validation"] if "regex" in str(v["condition"]))
    pattern = re.search(r'regex\("(.+?)", arn\)', condition)
    assert pattern is not None, condition
    arn = re.compile(pattern.group(1).replace("\\\\", "\\"))
    assert arn.search("arn:aws:kinesis:eu-west-1:123456789012:stream/orders")
    for wild in ("arn:aws:kinesis:eu-west-1:123456789012:stream/*", "*", "arn:aws:kinesis:*"):
        assert not arn.search(wild), wild
