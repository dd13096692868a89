"""The demo's fixed names and pace."""

APP = "demo"
TABLE = "kinesumer-demo"
STREAM = "demo-orders"
REGION = "us-east-1"
REFRESH = 0.5  # seconds between screen refreshes (and state table reads)
PHASE_TIMEOUT = 60.0  # a step that takes longer than this is reported as a failure
CLIENT_TIMEOUT = 3.0  # the members run with Config's defaults
