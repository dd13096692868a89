"""Read a stream that lives in another AWS account, checkpointing in your own account.

The stream's account has a role (infra/modules/cross-account-role) your consumer may assume,
optionally with an external id. Kinesis calls use that role's credentials, which the library
gets from sts:AssumeRole and renews before they expire; DynamoDB (the state table) stays in your
account with your own credentials. Nothing else changes: the same group, the same guarantees.

    export KINESUMER_ROLE_ARN=arn:aws:iam::210987654321:role/orders-reader
    export KINESUMER_EXTERNAL_ID=orders-etl-7f3a
    python examples/cross_account.py [N]     # stop after N records (default: until Ctrl-C)

Configuration: the environment variables of examples/basic.py, plus
    KINESUMER_ROLE_ARN      the role to assume in the stream's account (required)
    KINESUMER_EXTERNAL_ID   the external id the role's trust policy asks for (optional)
    KINESUMER_STS_ENDPOINT  an STS endpoint URL (optional: a VPC endpoint, or a local moto)
"""

from __future__ import annotations

import os
import sys

from kinesumer import Config, Kinesumer


def main() -> None:
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else None
    from_start = os.environ.get("KINESUMER_INITIAL_POSITION") == "TRIM_HORIZON"
    config = Config(
        app=os.environ.get("KINESUMER_APP", "examples"),
        dynamodb_table=os.environ.get("KINESUMER_TABLE", "kinesumer-state"),  # your account
        role_arn=os.environ["KINESUMER_ROLE_ARN"],  # the stream's account
        external_id=os.environ.get("KINESUMER_EXTERNAL_ID"),
        sts_endpoint=os.environ.get("KINESUMER_STS_ENDPOINT"),
        initial_position="TRIM_HORIZON" if from_start else "LATEST",
    )
    streams = os.environ.get("KINESUMER_STREAMS", "orders").split(",")
    seen = 0
    with Kinesumer(config) as consumer:
        print(f"consuming {', '.join(streams)} through {config.role_arn}", flush=True)
        for record in consumer.consume(streams):
            print(
                f"{record.stream}/{record.shard_id} #{record.sequence_number} "
                f"key={record.partition_key} data={record.data!r}",
                flush=True,
            )
            seen += 1
            if seen == limit:
                break
    print(f"done: {seen} records", flush=True)


if __name__ == "__main__":
    try:
        main()
    except KeyError as missing:
        sys.exit(f"set {missing.args[0]} (see the docstring of {sys.argv[0]})")
    except KeyboardInterrupt:
        sys.exit(130)
