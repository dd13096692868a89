"""What the library reports about itself (internal modules; the public names are re-exported from
:mod:`kinesumer`): ``metric_events`` (the events the engine reports), ``metric_families`` and
``metrics`` (Prometheus), ``otel_metrics`` (OpenTelemetry metrics), ``telemetry`` (spans).
"""
