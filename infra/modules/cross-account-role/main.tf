# The role a kinesumer consumer in another account assumes to read streams in
# this account. Only Kinesis is granted: the consumer's DynamoDB state table
# stays in its own account and is used with its own credentials.

data "aws_partition" "current" {}

locals {
  # A bare account id becomes that account's root principal, which delegates
  # to the account's IAM policies; role/user ARNs are used as given.
  trusted_principals = sort(distinct([
    for p in var.consumer_principals :
    can(regex("^[0-9]{12}$", p)) ? "arn:${data.aws_partition.current.partition}:iam::${p}:root" : p
  ]))

  # Same list as the consumer-policy module (tests/test_infra.py checks that
  # they agree); every one is authorized against the stream ARN.
  kinesis_read_actions = [
    "kinesis:DescribeStream", # fallback when DescribeStreamSummary/ListShards are unavailable
    "kinesis:DescribeStreamSummary",
    "kinesis:GetRecords",
    "kinesis:GetShardIterator",
    "kinesis:ListShards",
  ]
}

data "aws_iam_policy_document" "trust" {
  statement {
    sid     = "KinesumerConsumers"
    effect  = "Allow"
    actions = ["sts:AssumeRole"]

    principals {
      type        = "AWS"
      identifiers = local.trusted_principals
    }

    # Without the external id the call fails: this stops a third party that
    # also trusts the consumer account from steering it at this role.
    condition {
      test     = "StringEquals"
      variable = "sts:ExternalId"
      values   = [var.external_id]
    }
  }
}

data "aws_iam_policy_document" "kinesis_read" {
  statement {
    sid       = "KinesisRead"
    effect    = "Allow"
    actions   = local.kinesis_read_actions
    resources = sort(distinct(var.stream_arns))
  }

  dynamic "statement" {
    for_each = var.enhanced_fan_out && length(var.stream_arns) > 0 ? [1] : []
    content {
      # Enhanced fan-out, registration: authorized against the stream ARN.
      # The consumer is never deregistered by members (no DeregisterStreamConsumer:
      # `kinesumer deregister-consumer` is an operator's call).
      sid       = "KinesisEnhancedFanOutRegister"
      effect    = "Allow"
      actions   = ["kinesis:RegisterStreamConsumer"]
      resources = sort(distinct(var.stream_arns))
    }
  }

  dynamic "statement" {
    for_each = var.enhanced_fan_out && length(var.stream_arns) > 0 ? [1] : []
    content {
      # Enhanced fan-out, reading: authorized against the consumer ARN
      # (<stream ARN>/consumer/<name>:<creation timestamp>); the trailing
      # wildcard stands for the timestamp only, as it changes if the consumer is
      # registered again.
      sid     = "KinesisEnhancedFanOutSubscribe"
      effect  = "Allow"
      actions = ["kinesis:DescribeStreamConsumer", "kinesis:SubscribeToShard"]
      resources = sort([
        for arn in distinct(var.stream_arns) : "${arn}/consumer/${var.consumer_name}:*"
      ])
    }
  }

  dynamic "statement" {
    for_each = length(var.dead_letter_stream_arns) > 0 ? [1] : []
    content {
      # Handlers' dead letters (and retry-later records): PutRecord only, only
      # on the streams named for it. A stream encrypted with a customer-managed
      # key also needs kms:GenerateDataKey on that key (not granted here).
      sid       = "KinesisDeadLetterWrite"
      effect    = "Allow"
      actions   = ["kinesis:PutRecord"]
      resources = sort(distinct(var.dead_letter_stream_arns))
    }
  }

  dynamic "statement" {
    for_each = length(var.stream_kms_key_arns) > 0 ? [1] : []
    content {
      sid       = "StreamKeys"
      effect    = "Allow"
      actions   = ["kms:Decrypt"]
      resources = sort(distinct(var.stream_kms_key_arns))
    }
  }
}

resource "aws_iam_role" "this" {
  name                 = var.name
  path                 = var.path
  description          = var.description
  assume_role_policy   = data.aws_iam_policy_document.trust.json
  max_session_duration = var.max_session_duration
  permissions_boundary = var.permissions_boundary
  tags                 = var.tags
}

# Inline rather than managed: the grant only makes sense with this role and
# goes away with it.
resource "aws_iam_role_policy" "kinesis_read" {
  name   = "kinesumer-kinesis-read"
  role   = aws_iam_role.this.id
  policy = data.aws_iam_policy_document.kinesis_read.json
}
