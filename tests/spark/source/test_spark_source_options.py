"""The source's options as a user switching from another connector writes them: aliases of the
AWS Labs and Databricks connectors, "did you mean" hints by meaning, enhanced fan-out refused
(never accepted and ignored), a missing region named as an option, and the named error as the
first line of what ``load()`` raises through Spark."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from kinesumer import ConfigError
from kinesumer.spark.source.aliases import ALIASES, suggest
from kinesumer.spark.source.datasource import check_resources
from kinesumer.spark.source.options import parse_options

BASE = {"app": "orders", "dynamodb_table": "state-table", "streams": "a,b"}


def refused(options: dict[str, str]) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_options(options)
    return caught.value


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("max_record_per_trigger", "max_records_per_trigger"),
        ("maxRecordsPerTrigger", "max_records_per_trigger"),
        ("max-records-per-shard", "max_records_per_shard"),
        ("kinesis.streamNames", "streams"),
        ("stream_name", "streams"),
        ("dynamodb_tabel", "dynamodb_table"),
        ("kinesis.startPosition", "initial_position"),
        ("IdlePollInterval", "idle_poll_interval"),
    ],
)
def test_a_misspelt_option_hints_at_the_one_it_means(typed: str, meant: str) -> None:
    error = refused({**BASE, typed: "1"})
    assert error.field == typed.lower()
    assert f"(did you mean {meant!r}?)" in str(error)


def test_a_name_like_nothing_gets_no_hint() -> None:
    assert "did you mean" not in str(refused({**BASE, "colour": "blue"}))
    assert suggest("colour", ["app", "streams"]) is None


def test_databricks_option_names_mean_ours() -> None:
    theirs = parse_options(
        {
            "app": "orders",
            "dynamodb_table": "state-table",
            "streamName": "a,b",
            "region": "eu-west-1",
            "endpoint": "https://kinesis.eu-west-1.amazonaws.com",
            "initialPosition": "earliest",
            "consumerMode": "polling",
            "maxRecordsPerFetch": "500",
            "roleArn": "arn:aws:iam::123456789012:role/reader",
            "roleExternalId": "ext-1",
            "stsEndpoint": "https://sts.eu-west-1.amazonaws.com",
        }
    )
    ours = parse_options(
        {
            **BASE,
            "region": "eu-west-1",
            "kinesis_endpoint": "https://kinesis.eu-west-1.amazonaws.com",
            "initial_position": "TRIM_HORIZON",
            "scan_limit": "500",
            "role_arn": "arn:aws:iam::123456789012:role/reader",
            "external_id": "ext-1",
            "sts_endpoint": "https://sts.eu-west-1.amazonaws.com",
        }
    )
    assert theirs == ours


def test_aws_labs_option_names_mean_ours() -> None:
    theirs = parse_options(
        {
            "app": "orders",
            "kinesis.dynamodb.tableName": "state-table",
            "kinesis.streamName": "a",
            "kinesis.region": "us-east-1",
            "kinesis.kinesisRegion": "eu-west-1",
            "kinesis.endpointUrl": "https://kinesis.eu-west-1.amazonaws.com",
            "kinesis.startingPosition": "AT_TIMESTAMP 2023-08-30T19:00:05Z",
            "kinesis.consumerType": "GetRecords",
            "kinesis.maxFetchRecordsPerShard": "2000",
            "kinesis.maxFetchTimePerShardSec": "3",
            "kinesis.getRecords.numberOfRecordsPerFetch": "1000",
            "kinesis.stsRoleArn": "arn:aws:iam::123456789012:role/reader",
        }
    )
    assert theirs.streams == ("a",)
    assert theirs.config.dynamodb_table == "state-table"
    assert theirs.config.region == "us-east-1"
    assert theirs.config.kinesis_region == "eu-west-1"
    assert theirs.config.kinesis_endpoint == "https://kinesis.eu-west-1.amazonaws.com"
    assert theirs.config.initial_position == datetime(2023, 8, 30, 19, 0, 5, tzinfo=timezone.utc)
    assert (theirs.max_records_per_shard, theirs.max_read_seconds) == (2000, 3.0)
    assert theirs.config.scan_limit == 1000
    assert theirs.config.role_arn == "arn:aws:iam::123456789012:role/reader"


@pytest.mark.parametrize(
    ("value", "position"),
    [
        ("latest", "LATEST"),
        ("LATEST", "LATEST"),
        ("earliest", "TRIM_HORIZON"),
        ("trim_horizon", "TRIM_HORIZON"),
        ("EARLIEST", "TRIM_HORIZON"),
        (
            "at_timestamp 2026-01-02T03:04:05+00:00",
            datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc),
        ),
        (
            '{"at_timestamp": "2026-01-02T03:04:05Z"}',
            datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc),
        ),
    ],
)
def test_their_initial_positions_translate(value: str, position: Any) -> None:
    assert parse_options({**BASE, "initialPosition": value}).config.initial_position == position


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("at_timestamp", "starting_timestamp"),
        ("sometime", "ISO"),
        ("AT_TIMESTAMP yesterday", "ISO 8601"),
        ('{"at_timestamp": "06/25/2020"}', "ISO 8601"),
        ('{"at": "2026-01-02T03:04:05Z"}', "at_timestamp"),
        # a zone name: ambiguous (IST, CST) and seasonal; the offset is asked for
        (
            '{"at_timestamp": "06/25/2020 10:23:45 PDT", "format": "MM/dd/yyyy HH:mm:ss ZZZ"}',
            "write the offset",
        ),
        ('{"at_timestamp": "06/25/2020 10:23:45", "format": "MM/dd/yyyy HH:mm:ss"}', "no zone"),
        ('{"at_timestamp": "2020-06-25", "format": "MM/dd/yyyy XXX"}', "does not match"),
        ('{"at_timestamp": "06/25/20 +00:00", "format": "MM/dd/yy XXX"}', "yyyy"),
        ('{"at_timestamp": "13/45/2020 +00:00", "format": "MM/dd/yyyy XXX"}', "not a valid"),
        ('{"at_timestamp": "x 2020 +00:00", "format": "QQQ yyyy XXX"}', "'QQQ'"),
    ],
)
def test_a_position_we_cannot_read_is_a_named_error(value: str, says: str) -> None:
    error = refused({**BASE, "initialPosition": value})
    assert error.field == "initialposition" and says in str(error)


# -- starting_timestamp and the other connectors' ways of giving a starting time --------------

INSTANT = datetime(2026, 1, 2, 3, 4, 5, 250_000, tzinfo=timezone.utc)
INSTANT_MS = 1767323045250


@pytest.mark.parametrize(
    "given",
    [
        {"starting_timestamp": "2026-01-02T03:04:05.250Z"},
        {"starting_timestamp": "2026-01-02T04:04:05.25+01:00"},
        {"starting_timestamp": str(INSTANT_MS)},
        {"STARTING_TIMESTAMP": " 2026-01-02T03:04:05.250z "},
        {"initial_position": "AT_TIMESTAMP", "starting_timestamp": str(INSTANT_MS)},
        {"initial_position": "2026-01-02T03:04:05.250+00:00"},
        {"initial_position": "AT_TIMESTAMP 2026-01-02T03:04:05.250Z"},
        # AWS Labs: the time inside kinesis.startingPosition (it has no option of its own)
        {"kinesis.startingPosition": "AT_TIMESTAMP 2026-01-02T03:04:05.250Z"},
        {"kinesis.startingPosition": f"at_timestamp {INSTANT_MS}"},
        {"kinesis.startingPosition": "AT_TIMESTAMP", "starting_timestamp": str(INSTANT_MS)},
        # Databricks: the JSON, ISO 8601 or a Java date pattern in "format"
        {"initialPosition": '{"at_timestamp": "2026-01-02T03:04:05.250Z"}'},
        {
            "initialPosition": '{"at_timestamp": "01/02/2026 03:04:05.250 +00:00", '
            '"format": "MM/dd/yyyy HH:mm:ss.SSS XXX"}'
        },
        {
            "initialPosition": '{"at_timestamp": "02-Jan-2026 04:04:05.25 AM +0100", '
            '"format": "dd-MMM-yyyy hh:mm:ss.SS a Z"}'
        },
        {
            "initialPosition": '{"at_timestamp": "2026-01-02 \'at\' 03:04:05.250 UTC", '
            "\"format\": \"yyyy-MM-dd '''at''' HH:mm:ss.SSS z\"}"
        },
        # the same instant by two names is one instant
        {
            "starting_timestamp": str(INSTANT_MS),
            "initialPosition": '{"at_timestamp": "2026-01-02T03:04:05.250Z"}',
        },
    ],
)
def test_every_name_of_a_starting_time_means_the_same_initial_position(
    given: dict[str, str],
) -> None:
    options = parse_options({**BASE, **given})
    assert options.config.initial_position == INSTANT
    assert options == parse_options({**BASE, "starting_timestamp": "2026-01-02T03:04:05.250Z"})


def test_a_sub_millisecond_instant_rounds_up_to_the_next_millisecond() -> None:
    # Arrival times are whole milliseconds: one in ...05.250 arrived before ...05.2501.
    options = parse_options({**BASE, "starting_timestamp": "2026-01-02T03:04:05.2501Z"})
    assert options.config.initial_position == INSTANT + timedelta(milliseconds=1)


@pytest.mark.parametrize(
    ("given", "field", "says"),
    [
        (
            {"initial_position": "TRIM_HORIZON", "starting_timestamp": str(INSTANT_MS)},
            "initial_position",
            "is TRIM_HORIZON but 'starting_timestamp' gives a starting time",
        ),
        (
            {"initialPosition": "latest", "starting_timestamp": str(INSTANT_MS)},
            "initialposition",
            "is LATEST but 'starting_timestamp' gives a starting time",
        ),
        (
            {"kinesis.startingPosition": "EARLIEST", "starting_timestamp": str(INSTANT_MS)},
            "kinesis.startingposition",
            "Remove 'kinesis.startingposition' (or set it to AT_TIMESTAMP)",
        ),
        (
            {"initial_position": "AT_TIMESTAMP"},
            "initial_position",
            "no time is given: add the instant, as .option('starting_timestamp'",
        ),
        (
            {"kinesis.startingPosition": "AT_TIMESTAMP"},
            "kinesis.startingposition",
            "no time is given",
        ),
        (
            {"starting_timestamp": "2026-01-02T03:04:05"},
            "starting_timestamp",
            "has no offset: its instant would depend on the host's zone. Add Z",
        ),
        (
            {"starting_timestamp": "1767323045"},
            "starting_timestamp",
            "epoch seconds? Give milliseconds (1767323045000)",
        ),
        ({"starting_timestamp": "yesterday"}, "starting_timestamp", "not an ISO 8601 time"),
        ({"starting_timestamp": ""}, "starting_timestamp", "not an ISO 8601 time"),
        (
            {
                "starting_timestamp": str(INSTANT_MS),
                "kinesis.startingPosition": "AT_TIMESTAMP 2026-01-02T03:04:06Z",
            },
            "starting_timestamp",
            "is given twice with different values",
        ),
    ],
)
def test_an_inconsistent_or_unreadable_starting_time_is_a_named_error(
    given: dict[str, str], field: str, says: str
) -> None:
    error = refused({**BASE, **given})
    assert error.field == field
    assert says in str(error)


@pytest.mark.parametrize("typed", ["startingTimestamp", "starting-timestamp", "kinesis.timestamp"])
def test_a_misspelt_starting_timestamp_hints_at_it(typed: str) -> None:
    assert "(did you mean 'starting_timestamp'?)" in str(refused({**BASE, typed: "1"}))


def test_a_starting_time_round_trips_through_option_strings() -> None:
    from kinesumer.spark.source import option_strings

    options = parse_options({**BASE, "starting_timestamp": str(INSTANT_MS)})
    again = parse_options(option_strings(options.config, list(options.streams)))
    assert again.config.initial_position == INSTANT


@pytest.mark.parametrize(
    "efo",
    [
        {"kinesis.consumerType": "SubscribeToShard"},
        {"consumerMode": "efo"},
        {"consumer_type": "SubscribeToShard"},
        {"enhanced_fan_out": "true"},
    ],
)
def test_enhanced_fan_out_is_refused_not_ignored(efo: dict[str, str]) -> None:
    error = refused({**BASE, **efo})
    assert error.field in ("consumer_type", "enhanced_fan_out")
    assert "enhanced fan-out (SubscribeToShard) is not supported by the Spark source" in str(error)
    assert "polling" in str(error)


def test_polling_by_any_name_is_accepted() -> None:
    for polling in (
        {"consumerMode": "polling"},
        {"kinesis.consumerType": "GetRecords"},
        {"enhanced_fan_out": "false"},
    ):
        assert parse_options({**BASE, **polling}).config.enhanced_fan_out is False
    assert refused({**BASE, "consumerMode": "fast"}).field == "consumer_type"


@pytest.mark.parametrize(
    "name", ["awsAccessKey", "kinesis.awsSecretKey", "roleSessionName", "kinesis.failOnDataLoss"]
)
def test_their_options_we_cannot_honour_are_refused(name: str) -> None:
    error = refused({**BASE, name: "x"})
    assert error.field == name.lower() and "not supported by the kinesumer source" in str(error)


def test_an_alias_and_our_name_must_agree() -> None:
    error = refused({**BASE, "streamName": "c"})
    assert error.field == "streams" and "'streamname'" in str(error)
    assert parse_options({**BASE, "streamName": "a,b"}).streams == ("a", "b")


def test_every_alias_names_an_option_we_accept() -> None:
    for alias, (ours, _source) in ALIASES.items():
        assert alias == alias.lower()
        error = None
        try:
            parse_options({**BASE, ours: BASE.get(ours, "1"), alias: BASE.get(ours, "1")})
        except ConfigError as caught:
            error = caught
        assert error is None or "is not an option" not in str(error), alias


def test_no_region_anywhere_is_a_config_error_naming_region(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    with pytest.raises(ConfigError) as caught:
        check_resources(parse_options(BASE))
    assert caught.value.field == "region" and ".option('region'" in str(caught.value)


# -- through Spark -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    from support.spark_source import local_spark

    with local_spark("local[1]") as session:
        yield session


def test_load_raises_the_named_error_first(spark: Any) -> None:
    from kinesumer.spark.source import register

    register(spark)  # again: registering is idempotent within a session (read_stream relies on it)
    options = {**BASE, "region": "eu-west-1", "max_record_per_trigger": "10"}
    with pytest.raises(Exception) as caught:
        spark.readStream.format("kinesumer").options(**options).load()
    first = str(caught.value).splitlines()[0]
    assert first == (
        "[PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source instance: "
        "kinesumer.errors.ConfigError: Config.max_record_per_trigger: is not an option of the "
        "kinesumer source (did you mean 'max_records_per_trigger'?)"
    )
    assert "Traceback" not in str(caught.value)


def test_the_aliases_of_role_arn_and_external_id_are_redacted_too(
    spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from kinesumer.spark.source import SCHEMA

    role, external = "arn:aws:iam::210987654321:role/orders-reader", "ext-do-not-show"
    for names in (("roleArn", "roleExternalId"), ("kinesis.stsRoleArn", "externalId")):
        df = (
            spark.readStream.format("kinesumer")
            .schema(SCHEMA)
            .options(**BASE, region="eu-west-1")
            .option(names[0], role)
            .option(names[1], external)
            .load()
        )
        capsys.readouterr()
        df.explain(extended=True)
        plan = capsys.readouterr().out
        assert "region=eu-west-1" in plan, plan
        assert role not in plan and external not in plan, plan


# -- logs ----------------------------------------------------------------------------------------


@pytest.fixture
def kinesumer_logger() -> Iterator[Any]:
    import logging

    logger = logging.getLogger("kinesumer")
    saved = (logger.level, list(logger.handlers))
    logger.handlers.clear()
    logger.setLevel(logging.NOTSET)
    yield logger
    logger.setLevel(saved[0])
    logger.handlers[:] = saved[1]


def test_log_level_reaches_every_worker_that_builds_or_unpickles_the_options(
    monkeypatch: pytest.MonkeyPatch, kinesumer_logger: Any
) -> None:
    import logging
    import pickle

    from kinesumer.spark.source import logs

    parsed = parse_options({**BASE, "log_level": "info"})
    assert parsed.log_level == "INFO"
    assert kinesumer_logger.level == logging.NOTSET and not kinesumer_logger.handlers  # the app's
    monkeypatch.setattr(logs, "in_spark_worker", lambda: True)
    shipped = pickle.dumps(parsed)
    restored = pickle.loads(shipped)  # as an executor's worker gets it
    assert restored == parsed
    assert kinesumer_logger.level == logging.INFO and len(kinesumer_logger.handlers) == 1
    parse_options({**BASE, "log_level": "DEBUG"})  # as the planner's worker builds it
    assert kinesumer_logger.level == logging.DEBUG and len(kinesumer_logger.handlers) == 1
    assert refused({**BASE, "log_level": "loud"}).field == "log_level"


def test_log_level_brings_the_workers_info_lines_to_the_drivers_stderr(
    spark: Any, kinesalite: Any, dynalite: Any, unique_name: Any, tmp_path: Any, request: Any
) -> None:
    """The executors' INFO line for each shard read reaches the application's stderr (local
    mode: Spark copies its workers' stderr there), from a process other than this one. The JVM
    holds the stderr pytest had when the session started (its global capture), read here."""
    import os
    import re

    from support.group import create_stream, put
    from support.spark_source import Collector, spark_group, start_query

    group = spark_group(kinesalite, dynalite, unique_name)
    config, stream = group["config"], group["stream"]
    create_stream(group["url"], stream, 1)
    put(group["url"], stream, 0, 5)
    sink = Collector()
    config = config.replace(initial_position="TRIM_HORIZON")
    query = start_query(
        spark, config, [stream], sink, str(tmp_path / "cp"), available_now=True, log_level="INFO"
    )
    try:
        query.awaitTermination(300)
    finally:
        if query.isActive:
            query.stop()
    assert len(sink.rows()) == 5
    capture = request.config.pluginmanager.getplugin("capturemanager")
    if capture is None or not capture.is_globally_capturing():
        pytest.skip("needs pytest's fd capture (not -s)")
    err = capture.read_global_capture()[1]
    lines = [ln for ln in err.splitlines() if " INFO kinesumer.spark.source [pid " in ln]
    assert any(re.search(r": 5 records", ln) for ln in lines), err[-3000:]
    assert all(f"[pid {os.getpid()}]" not in ln for ln in lines)


def test_shared_group_and_outage_timeout_are_parsed_and_checked() -> None:
    parsed = parse_options(BASE)
    assert parsed.shared_group is False and parsed.outage_timeout == 300.0
    parsed = parse_options({**BASE, "shared_group": "true", "outage_timeout": "30"})
    assert parsed.shared_group is True and parsed.outage_timeout == 30.0
    assert "shared_group" in str(refused({**BASE, "shared_group": "maybe"}))
    assert "outage_timeout" in str(refused({**BASE, "outage_timeout": "0"}))
