locals {
  # Every Kinesis call a consumer makes. All of them are authorized against the
  # stream ARN (IAM resource type "stream"), including ListShards, so no "*" is
  # needed. ListStreams (resource "*") is not used: streams are named in the
  # config. Enhanced fan-out (RegisterStreamConsumer on the stream,
  # DescribeStreamConsumer and SubscribeToShard on the consumer ARN) is granted
  # only with var.enhanced_fan_out, in statements of its own below.
  # Keep in sync with the cross-account-role module; tests/test_infra.py checks.
  kinesis_read_actions = [
    "kinesis:DescribeStream", # fallback when DescribeStreamSummary/ListShards are unavailable
    "kinesis:DescribeStreamSummary",
    "kinesis:GetRecords",
    "kinesis:GetShardIterator",
    "kinesis:ListShards",
  ]

  # Item calls on the state table, plus DescribeTable, which the library calls
  # once at start to check the key schema. No CreateTable/UpdateTimeToLive:
  # `kinesumer create-table` is for local work only. No index ARNs: the table
  # has no secondary indexes.
  dynamodb_actions = [
    "dynamodb:BatchGetItem",
    "dynamodb:BatchWriteItem",
    "dynamodb:DeleteItem",
    "dynamodb:DescribeTable",
    "dynamodb:GetItem",
    "dynamodb:PutItem",
    "dynamodb:Query",
    "dynamodb:UpdateItem",
  ]

  # Region of the table's key, for the kms:ViaService condition.
  table_kms_region = var.table_kms_key_arn == null ? null : split(":", var.table_kms_key_arn)[3]
}

data "aws_iam_policy_document" "this" {
  dynamic "statement" {
    for_each = length(var.stream_arns) > 0 ? [1] : []
    content {
      sid       = "KinesisRead"
      effect    = "Allow"
      actions   = local.kinesis_read_actions
      resources = sort(distinct(var.stream_arns))
    }
  }

  statement {
    sid       = "StateTable"
    effect    = "Allow"
    actions   = local.dynamodb_actions
    resources = [var.table_arn]
  }

  dynamic "statement" {
    for_each = var.table_kms_key_arn == null ? [] : [1]
    content {
      # What DynamoDB needs from a customer-managed table key when it acts for
      # this principal (AWS documents GenerateDataKey* and ReEncrypt*; spelled
      # out here so that no action carries a wildcard). The condition keeps the
      # key usable only through DynamoDB.
      sid    = "StateTableKey"
      effect = "Allow"
      actions = [
        "kms:CreateGrant",
        "kms:Decrypt",
        "kms:DescribeKey",
        "kms:Encrypt",
        "kms:GenerateDataKey",
        "kms:GenerateDataKeyWithoutPlaintext",
        "kms:ReEncryptFrom",
        "kms:ReEncryptTo",
      ]
      resources = [var.table_kms_key_arn]
      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = ["dynamodb.${local.table_kms_region}.amazonaws.com"]
      }
    }
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
      # GetRecords on a stream encrypted with a customer-managed key.
      sid       = "StreamKeys"
      effect    = "Allow"
      actions   = ["kms:Decrypt"]
      resources = sort(distinct(var.stream_kms_key_arns))
    }
  }

  dynamic "statement" {
    for_each = length(var.assume_role_arns) > 0 ? [1] : []
    content {
      # Cross-account streams: the consumer reads Kinesis with credentials of
      # a role in the stream's account and keeps DynamoDB in its own account.
      sid       = "AssumeStreamRoles"
      effect    = "Allow"
      actions   = ["sts:AssumeRole"]
      resources = sort(distinct(var.assume_role_arns))
    }
  }
}

resource "aws_iam_policy" "this" {
  count = var.create_policy ? 1 : 0

  name        = var.policy_name
  name_prefix = var.policy_name == null ? "kinesumer-consumer-" : null
  path        = var.policy_path
  description = var.description
  policy      = data.aws_iam_policy_document.this.json
  tags        = var.tags
}
