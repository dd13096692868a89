# The role a kinesumer consumer in another account assumes to read streams in
# this account. Only Kinesis is granted: the consumer's DynamoDB state table
# stays in its own account and is used with its own credentials.

data "aws_partition" "current" {}

# The account the role is made in, to turn stream_names into ARNs; read only
# when names are given, so a module call with ARNs only makes no lookup.
data "aws_caller_identity" "current" {
  count = length(var.stream_names) > 0 ? 1 : 0
}

locals {
  # Who may assume the role is named, never a whole account: a bare account
  # (its root principal) would let any role or user there that its own account
  # allows use this one. Role/user ARNs in consumer_principals are trusted as
  # given; consumer_principal_arn_patterns (roles whose names vary, e.g. with
  # a deployment suffix) trust their accounts' root principals only under an
  # aws:PrincipalArn condition that names them.
  pattern_accounts = sort(distinct([
    for p in var.consumer_principal_arn_patterns :
    "arn:${data.aws_partition.current.partition}:iam::${split(":", p)[4]}:root"
  ]))

  # Per consumer account (consumer_accounts): its named roles, and its role
  # patterns under aws:PrincipalArn, each with that account's external id.
  # The principals are not secret: only the external ids stay sensitive.
  account_principals = nonsensitive({
    for account, c in var.consumer_accounts : account => sort(distinct(c.principals))
    if length(c.principals) > 0
  })
  account_patterns = nonsensitive({
    for account, c in var.consumer_accounts : account => sort(distinct(c.principal_arn_patterns))
    if length(c.principal_arn_patterns) > 0
  })
  account_external_ids = {
    for account, c in var.consumer_accounts : account => c.external_id != null ? c.external_id : var.external_id
  }

  # Every Kinesis stream the role reads: the ARNs given, and the names given
  # per region made into this account's ARNs.
  stream_arns = sort(distinct(concat(var.stream_arns, flatten([
    for region, names in var.stream_names : [
      for name in names :
      "arn:${data.aws_partition.current.partition}:kinesis:${region}:${data.aws_caller_identity.current[0].account_id}:stream/${name}"
    ]
  ]))))

  # stream_kms_keys: each key for exactly the streams that use it, through
  # Kinesis in the key's region. The statement id is made of the key's region
  # and id (a Sid is alphanumeric and unique in a policy).
  stream_keys = {
    for key in distinct(values(var.stream_kms_keys)) : key => {
      sid     = "StreamKey${replace(split(":", key)[3], "-", "")}${replace(split("/", key)[1], "-", "")}"
      region  = split(":", key)[3]
      streams = sort([for stream, k in var.stream_kms_keys : stream if k == key])
    }
  }

  # What kinesumer calls on a DynamoDB table's stream (kinesis/dynamodb_streams.py),
  # authorized against the stream ARN. ListStreams (resource "*") is not
  # called: the stream is named by its ARN.
  table_stream_read_actions = [
    "dynamodb:DescribeStream",
    "dynamodb:GetRecords",
    "dynamodb:GetShardIterator",
  ]

  # Same list as the consumer-policy module (tests/infra/test_infra.py checks that
  # they agree); every one is authorized against the stream ARN. DescribeStream
  # is not listed: the library never calls it.
  kinesis_read_actions = [
    "kinesis:DescribeStreamSummary",
    "kinesis:GetRecords",
    "kinesis:GetShardIterator",
    "kinesis:ListShards",
  ]

  # As in the consumer-policy module: each key through Kinesis in its region.
  stream_kms_services = sort(distinct([
    for arn in var.stream_kms_key_arns : "kinesis.${split(":", arn)[3]}.amazonaws.com"
  ]))
  dead_letter_kms_services = sort(distinct([
    for arn in var.dead_letter_stream_kms_key_arns : "kinesis.${split(":", arn)[3]}.amazonaws.com"
  ]))
}

data "aws_iam_policy_document" "trust" {
  dynamic "statement" {
    for_each = local.account_principals
    content {
      sid     = "KinesumerConsumers${statement.key}"
      effect  = "Allow"
      actions = ["sts:AssumeRole"]

      principals {
        type        = "AWS"
        identifiers = statement.value
      }

      condition {
        test     = "StringEquals"
        variable = "sts:ExternalId"
        values   = [local.account_external_ids[statement.key]]
      }
    }
  }

  dynamic "statement" {
    for_each = local.account_patterns
    content {
      sid     = "KinesumerConsumersByArn${statement.key}"
      effect  = "Allow"
      actions = ["sts:AssumeRole"]

      principals {
        type        = "AWS"
        identifiers = ["arn:${data.aws_partition.current.partition}:iam::${statement.key}:root"]
      }

      condition {
        test     = "ArnLike"
        variable = "aws:PrincipalArn"
        values   = statement.value
      }

      condition {
        test     = "StringEquals"
        variable = "sts:ExternalId"
        values   = [local.account_external_ids[statement.key]]
      }
    }
  }

  dynamic "statement" {
    for_each = length(var.consumer_principals) > 0 ? [1] : []
    content {
      sid     = "KinesumerConsumers"
      effect  = "Allow"
      actions = ["sts:AssumeRole"]

      principals {
        type        = "AWS"
        identifiers = sort(distinct(var.consumer_principals))
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

  dynamic "statement" {
    for_each = length(var.consumer_principal_arn_patterns) > 0 ? [1] : []
    content {
      sid     = "KinesumerConsumersByArn"
      effect  = "Allow"
      actions = ["sts:AssumeRole"]

      principals {
        type        = "AWS"
        identifiers = local.pattern_accounts
      }

      # The accounts are trusted only for the principals these patterns name.
      condition {
        test     = "ArnLike"
        variable = "aws:PrincipalArn"
        values   = sort(distinct(var.consumer_principal_arn_patterns))
      }

      condition {
        test     = "StringEquals"
        variable = "sts:ExternalId"
        values   = [var.external_id]
      }
    }
  }
}

data "aws_iam_policy_document" "kinesis_read" {
  dynamic "statement" {
    for_each = length(local.stream_arns) > 0 ? [1] : []
    content {
      sid       = "KinesisRead"
      effect    = "Allow"
      actions   = local.kinesis_read_actions
      resources = local.stream_arns
    }
  }

  dynamic "statement" {
    for_each = length(var.table_stream_arns) > 0 ? [1] : []
    content {
      sid       = "DynamoDBStreamsRead"
      effect    = "Allow"
      actions   = local.table_stream_read_actions
      resources = sort(distinct(var.table_stream_arns))
    }
  }

  dynamic "statement" {
    for_each = local.stream_keys
    content {
      # GetRecords on a stream encrypted with this key: through Kinesis in the
      # key's region only, for the streams mapped to the key only.
      sid       = statement.value.sid
      effect    = "Allow"
      actions   = ["kms:Decrypt"]
      resources = [statement.key]

      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = ["kinesis.${statement.value.region}.amazonaws.com"]
      }

      condition {
        test     = "StringEquals"
        variable = "kms:EncryptionContext:aws:kinesis:arn"
        values   = statement.value.streams
      }
    }
  }

  dynamic "statement" {
    for_each = var.enhanced_fan_out && length(local.stream_arns) > 0 ? [1] : []
    content {
      # Enhanced fan-out, registration: authorized against the stream ARN.
      # The consumer is never deregistered by members (no DeregisterStreamConsumer:
      # `kinesumer deregister-consumer` is an operator's call).
      sid       = "KinesisEnhancedFanOutRegister"
      effect    = "Allow"
      actions   = ["kinesis:RegisterStreamConsumer"]
      resources = local.stream_arns
    }
  }

  dynamic "statement" {
    for_each = var.enhanced_fan_out && length(local.stream_arns) > 0 ? [1] : []
    content {
      # Enhanced fan-out, reading: authorized against the consumer ARN
      # (<stream ARN>/consumer/<name>:<creation timestamp>); the trailing
      # wildcard stands for the timestamp only, as it changes if the consumer is
      # registered again.
      sid     = "KinesisEnhancedFanOutSubscribe"
      effect  = "Allow"
      actions = ["kinesis:DescribeStreamConsumer", "kinesis:SubscribeToShard"]
      resources = sort([
        for arn in local.stream_arns : "${arn}/consumer/${var.consumer_name}:*"
      ])
    }
  }

  dynamic "statement" {
    for_each = length(var.dead_letter_stream_arns) > 0 ? [1] : []
    content {
      # Handlers' dead letters (and retry-later records): PutRecord, and
      # DescribeStreamSummary so run() finds a missing stream when it starts
      # rather than when the first record fails; only on the streams named for
      # it. A stream encrypted with a customer-managed key also needs
      # kms:GenerateDataKey on that key: dead_letter_stream_kms_key_arns.
      sid       = "KinesisDeadLetterWrite"
      effect    = "Allow"
      actions   = ["kinesis:DescribeStreamSummary", "kinesis:PutRecord"]
      resources = sort(distinct(var.dead_letter_stream_arns))
    }
  }

  dynamic "statement" {
    for_each = length(var.stream_kms_key_arns) > 0 ? [1] : []
    content {
      # GetRecords on a stream encrypted with a customer-managed key: through
      # Kinesis only, for the streams read only.
      sid       = "StreamKeys"
      effect    = "Allow"
      actions   = ["kms:Decrypt"]
      resources = sort(distinct(var.stream_kms_key_arns))

      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = local.stream_kms_services
      }

      condition {
        test     = "StringEquals"
        variable = "kms:EncryptionContext:aws:kinesis:arn"
        values   = local.stream_arns
      }
    }
  }

  dynamic "statement" {
    for_each = length(var.dead_letter_stream_kms_key_arns) > 0 ? [1] : []
    content {
      # PutRecord on a dead-letter or retry-later stream encrypted with a
      # customer-managed key: through Kinesis only, for those streams only.
      sid       = "DeadLetterStreamKeys"
      effect    = "Allow"
      actions   = ["kms:GenerateDataKey"]
      resources = sort(distinct(var.dead_letter_stream_kms_key_arns))

      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = local.dead_letter_kms_services
      }

      condition {
        test     = "StringEquals"
        variable = "kms:EncryptionContext:aws:kinesis:arn"
        values   = sort(distinct(var.dead_letter_stream_arns))
      }
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
