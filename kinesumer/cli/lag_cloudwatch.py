"""``kinesumer lag --serve --cloudwatch-namespace NS``: the group's lag published to CloudWatch
after each good probe, for the autoscalers that read CloudWatch (ECS service auto scaling,
EC2 Auto Scaling target tracking, CloudWatch alarms).

One ``PutMetricData`` call per good probe (more only past :data:`BATCH` streams), in the
namespace given, timestamped with the probe's start:

- ``MaxMillisBehind`` with the dimension ``App``: the group's lag, its furthest-behind shard;
- ``MaxMillisBehind`` with the dimensions ``App`` and ``Stream``: each stream's.

The unit is ``Milliseconds``, as the figure is measured (``max_millis_behind`` of ``/lag.json``)
and as Kinesis's own ``GetRecords.IteratorAgeMilliseconds``, so an alarm on either reads the
same scale. A failed probe publishes nothing: CloudWatch sees missing data (an alarm's
"treat missing data" decides), never a stale figure again. A failed publish is logged and
counted (``kinesumer_lag_cloudwatch_publishes_total{result="error"}``) and the server goes on:
the next good probe publishes again.

The client is boto3's, with the group's region (``--region``, else boto3's chain) and the
default credentials; it needs ``cloudwatch:PutMetricData`` (which IAM cannot narrow to a
resource: scope it with the ``cloudwatch:namespace`` condition key).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

from botocore.config import Config as BotoConfig

from ..aws.clients import blocking_client, region_required
from ..config import Config, check_endpoint
from ..errors import ConfigError
from .lag_board import Snapshot

__all__ = ["BATCH", "METRIC_NAME", "UNIT", "CloudWatchPublisher"]

#: The metric's name, its unit, and the most datapoints one PutMetricData call carries here
#: (the service takes 1,000 today; 20 was its limit for years, and is what stand-ins enforce).
METRIC_NAME = "MaxMillisBehind"
UNIT = "Milliseconds"
BATCH = 20

#: A publish must not hold the probe thread for long: botocore's timeouts and 2 attempts.
TIMEOUT = 5.0

#: What CloudWatch accepts in a namespace.
_NAMESPACE = re.compile(r"[A-Za-z0-9.\-_/#:]{1,255}", re.ASCII)
WHERE = "CloudWatchPublisher"

log = logging.getLogger("kinesumer.cli.lag_cloudwatch")


class CloudWatchPublisher:
    """Publishes each good probe's figures to CloudWatch (``namespace``), through a boto3
    client made at the first publish (``client``: one already made, for tests). Call it with a
    :class:`~.lag_board.Snapshot` (a listener of :class:`~.lag_serve.ProbeLoop`): it never
    raises; a failure is logged and counted. Also a prometheus_client collector of those
    counts (register it on the server's registry)."""

    def __init__(
        self,
        namespace: str,
        config: Config,
        *,
        endpoint: str | None = None,
        client: Any = None,
    ) -> None:
        if not _NAMESPACE.fullmatch(namespace) or namespace.startswith(":"):
            raise ConfigError(
                "namespace",
                f"a CloudWatch namespace is 1-255 of [A-Za-z0-9.-_/#:], got {namespace!r}",
                WHERE,
            )
        if namespace.startswith("AWS/"):
            raise ConfigError("namespace", f"AWS/ is AWS's own, got {namespace!r}", WHERE)
        check_endpoint("endpoint", endpoint, config.allow_insecure_endpoints)
        self.namespace = namespace
        self._config = config
        self._endpoint = endpoint
        self._client = client
        self._lock = threading.Lock()
        self.published = 0
        self.failed = 0
        self.last_error: str | None = None

    def __call__(self, snapshot: Snapshot) -> None:
        try:
            cloudwatch = self.client()
            for batch in _batches(self.datapoints(snapshot)):
                cloudwatch.put_metric_data(Namespace=self.namespace, MetricData=batch)
        except Exception as exc:  # counted and logged: the server goes on
            line = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
            with self._lock:
                self.failed += 1
                self.last_error = line
            log.warning("publishing the lag to CloudWatch failed: %s", line)
        else:
            with self._lock:
                self.published += 1

    def datapoints(self, snapshot: Snapshot) -> list[dict[str, Any]]:
        """The MetricData of one probe: the group's maximum, then each stream's."""
        figure = snapshot.figure
        at = datetime.fromtimestamp(snapshot.probed_at_ms / 1000, timezone.utc)
        app = [{"Name": "App", "Value": figure.app}]

        def point(dimensions: list[dict[str, str]], millis: int) -> dict[str, Any]:
            return {
                "MetricName": METRIC_NAME,
                "Dimensions": dimensions,
                "Timestamp": at,
                "Value": float(millis),
                "Unit": UNIT,
            }

        points = [point(app, figure.max_millis_behind)]
        for stream, millis in sorted(figure.streams.items()):
            points.append(point([*app, {"Name": "Stream", "Value": stream}], millis))
        return points

    def client(self) -> Any:
        if self._client is None:
            with region_required("CloudWatch", "region"):
                self._client = blocking_client(
                    "cloudwatch",
                    region_name=self._config.region,
                    endpoint_url=self._endpoint,
                    config=BotoConfig(
                        connect_timeout=TIMEOUT,
                        read_timeout=TIMEOUT,
                        retries={"total_max_attempts": 2, "mode": "standard"},
                    ),
                )
        return self._client

    def collect(self) -> Iterator[Any]:
        """``kinesumer_lag_cloudwatch_publishes_total{app,result}``: publishes made, ``ok`` or
        ``error`` (a prometheus_client collector)."""
        from prometheus_client.core import CounterMetricFamily

        with self._lock:
            counts = {"ok": self.published, "error": self.failed}
        family = CounterMetricFamily(
            "kinesumer_lag_cloudwatch_publishes",
            "Lag publishes to CloudWatch, by result",
            labels=["app", "result"],
        )
        for result, count in counts.items():
            family.add_metric([self._config.app, result], count)
        yield family


def _batches(points: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    for start in range(0, len(points), BATCH):
        yield points[start : start + BATCH]
