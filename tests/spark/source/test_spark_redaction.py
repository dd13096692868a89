"""The streaming source keeps ``role_arn`` and ``external_id`` out of Spark's plans (what
``explain()``, the UI's SQL tab and event logs show): Spark's default redaction patterns match
neither name. One short local Spark session; the source is loaded with an explicit schema, so
nothing connects to AWS."""

from __future__ import annotations

from typing import Any

import pytest
from support.spark_source import local_spark

pytest.importorskip("pyspark.sql.streaming.datasource", reason="needs pyspark 4.2+")

ROLE_ARN = "arn:aws:iam::210987654321:role/orders-reader"
EXTERNAL_ID = "orders-etl-7f3a-do-not-show"


def test_explain_redacts_the_role_and_external_id(capsys: pytest.CaptureFixture[str]) -> None:
    from kinesumer.spark.source import SCHEMA, SENSITIVE_OPTIONS, redact_sensitive_options

    with local_spark("local[1]") as spark:  # registers the source, as an application does
        df: Any = (
            spark.readStream.format("kinesumer")
            .schema(SCHEMA)
            .option("app", "orders-etl")
            .option("dynamodb_table", "kinesumer-state")
            .option("streams", "orders")
            .option("region", "eu-west-1")
            .option("role_arn", ROLE_ARN)
            .option("External_Id", EXTERNAL_ID)  # option names are case-insensitive
            .load()
        )
        capsys.readouterr()
        df.explain(extended=True)
        plan = capsys.readouterr().out
        assert "StreamingRelationV2" in plan and "kinesumer" in plan, plan
        assert "region=eu-west-1" in plan  # other options stay visible
        assert ROLE_ARN not in plan and EXTERNAL_ID not in plan, plan
        assert "role_arn=*********(redacted)" in plan
        # Spark's own pattern (URLs) is kept, and calling again changes nothing.
        conf = spark.conf.get("spark.sql.redaction.options.regex")
        assert conf.startswith("(?i)url|") and all(name in conf for name in SENSITIVE_OPTIONS)
        redact_sensitive_options(spark)
        assert spark.conf.get("spark.sql.redaction.options.regex") == conf
