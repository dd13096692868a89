# The kinesumer state table. Its shape is fixed by the library
# (kinesumer/statestore/schema.py): hash key "pk" (S), range key "sk" (S),
# TTL on "expires_at" (epoch seconds), no secondary indexes. The library checks
# the key schema with DescribeTable at start, so changing it here breaks every
# consumer; tests/infra/test_infra.py parses this file and compares it with schema.py.
resource "aws_dynamodb_table" "this" {
  name         = var.name
  billing_mode = var.billing_mode
  # null unless PROVISIONED: the variables' validations enforce the pairing,
  # because DynamoDB rejects capacities on an on-demand table.
  read_capacity  = var.read_capacity
  write_capacity = var.write_capacity

  hash_key  = "pk"
  range_key = "sk"

  # Only key attributes are declared: DynamoDB is schemaless for the rest, and
  # declaring a non-key attribute without an index is an error.
  attribute {
    name = "pk"
    type = "S"
  }

  attribute {
    name = "sk"
    type = "S"
  }

  # Client (membership) items carry expires_at so that DynamoDB removes members
  # that died without deregistering. The library never relies on TTL for
  # correctness (deletion can lag by days); it only keeps the table small.
  ttl {
    attribute_name = "expires_at"
    enabled        = true
  }

  point_in_time_recovery {
    enabled = var.point_in_time_recovery
  }

  # enabled = false means the AWS-owned key (DynamoDB's default, free). With a
  # key ARN the table uses that customer-managed key. The AWS-managed
  # aws/dynamodb key (enabled without an ARN) is deliberately not offered: it
  # costs KMS calls and gives no control over the key policy.
  server_side_encryption {
    enabled     = var.kms_key_arn != null
    kms_key_arn = var.kms_key_arn
  }

  deletion_protection_enabled = var.deletion_protection

  tags = var.tags
}
