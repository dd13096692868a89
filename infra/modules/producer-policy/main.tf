# The least privilege of a kinesumer Producer, and so of an outbox relay (it
# puts through a Producer): PutRecords, ListShards (shard-aware batching) and
# DescribeStreamSummary (a stream's maximum record size, asked for records
# over 1 MiB only) on the named streams only. No stream administration, no reads, no
# wildcard: an outbox row names its own stream, so this list, with the relay's
# --streams, is what bounds where rows written by anyone who can INSERT into
# the outbox table can go.

locals {
  producer_actions = [
    "kinesis:DescribeStreamSummary",
    "kinesis:ListShards",
    "kinesis:PutRecords",
  ]
  kms_services = sort(distinct([
    for arn in var.stream_kms_key_arns : "kinesis.${split(":", arn)[3]}.amazonaws.com"
  ]))
}

data "aws_iam_policy_document" "this" {
  statement {
    sid       = "KinesisPut"
    effect    = "Allow"
    actions   = local.producer_actions
    resources = sort(distinct(var.stream_arns))
  }

  dynamic "statement" {
    for_each = length(var.stream_kms_key_arns) > 0 ? [1] : []
    content {
      # PutRecords on a stream encrypted with a customer-managed key: through
      # Kinesis only, for the named streams only.
      sid       = "StreamKeys"
      effect    = "Allow"
      actions   = ["kms:GenerateDataKey"]
      resources = sort(distinct(var.stream_kms_key_arns))

      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = local.kms_services
      }

      condition {
        test     = "StringEquals"
        variable = "kms:EncryptionContext:aws:kinesis:arn"
        values   = sort(distinct(var.stream_arns))
      }
    }
  }
}

resource "aws_iam_policy" "this" {
  count       = var.name == null ? 0 : 1
  name        = var.name
  description = "kinesumer producer / outbox relay: puts to named streams"
  policy      = data.aws_iam_policy_document.this.json
}
