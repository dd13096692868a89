locals {
  # Every Kinesis call a consumer makes. All of them are authorized against the
  # stream ARN (IAM resource type "stream"), including ListShards, so no "*" is
  # needed. ListStreams (resource "*") is not used: streams are named in the
  # config. Enhanced fan-out (RegisterStreamConsumer on the stream,
  # DescribeStreamConsumer and SubscribeToShard on the consumer ARN) is granted
  # only with var.enhanced_fan_out, in statements of its own below.
  # DescribeStream is not listed: the library never calls it (DescribeStreamSummary
  # and ListShards give what it needs; tests/infra/test_infra.py scans kinesumer/ for
  # every call). Keep in sync with the cross-account-role module; the tests check.
  kinesis_read_actions = [
    "kinesis:DescribeStreamSummary",
    "kinesis:GetRecords",
    "kinesis:GetShardIterator",
    "kinesis:ListShards",
  ]

  # Item calls on the state table. No Scan, no CreateTable/UpdateTimeToLive:
  # `kinesumer create-table` is for local work only. No index ARNs: the table
  # has no secondary indexes. DescribeTable (the start-up schema check) has a
  # statement of its own: it names no item, so it has no leading keys.
  dynamodb_item_actions = [
    "dynamodb:BatchGetItem",
    "dynamodb:BatchWriteItem",
    "dynamodb:DeleteItem",
    "dynamodb:GetItem",
    "dynamodb:PutItem",
    "dynamodb:Query",
    "dynamodb:UpdateItem",
  ]

  # The partition keys (pk) the library reads and writes for an app A. One
  # table serves many apps: the policy admits only its own apps' items, so one
  # app cannot rewrite (or read) another's membership, checkpoints or shard
  # caches. App names are [A-Za-z0-9_.-] (no '#', '*' or '?'), so "X#A" and
  # "X#A#*" match app A's keys only, never those of an app whose name merely
  # starts with A. tests/infra/test_infra.py checks this list against every pk form
  # in kinesumer/.
  app_partitions = [
    "client",       # client#A: members (statestore/schema.py)
    "controls",     # controls#A: pins, step-downs (statestore/dynamodb/controls.py)
    "load",         # load#A: members' reported load
    "shard_cache",  # shard_cache#A: shard lists (and their chunks)
    "spark_latest", # spark_latest#A: where the Spark source first read a shard at LATEST
    "view",         # view#A: the membership view (statestore/dynamodb/view.py)
    "weights",      # weights#A: weighted assignment
  ]
  app_partition_families = [
    "broadcast",    # broadcast#A#<client id>: broadcast positions
    "check_point",  # check_point#A#<stream>: checkpoints
    "spark_ledger", # spark_ledger#A#<query>: the Spark source's batch ledger
  ]
  # A Spark streaming query is a consumer group of its own, "<app>.spark-<query>"
  # (kinesumer/spark/source/groups.py): the kinds of item a group keeps, under that
  # name. Its batch ledger stays under the app (spark_ledger#A#<query>).
  query_group_kinds = concat(local.app_partitions, ["check_point"])
  state_table_leading_keys = sort(flatten([
    for app in distinct(var.apps) : concat(
      [for p in local.app_partitions : "${p}#${app}"],
      [for p in local.app_partition_families : "${p}#${app}#*"],
      var.spark_query_groups ? [for p in local.query_group_kinds : "${p}#${app}.spark-*"] : [],
    )
  ]))

  # Region of the table's key, for the kms:ViaService condition.
  table_kms_region = var.table_kms_key_arn == null ? null : split(":", var.table_kms_key_arn)[3]

  # Kinesis uses a stream's key in the stream's region (a KMS key is regional):
  # each key is usable only through Kinesis there, and only for the streams
  # named here (Kinesis puts the stream ARN in the encryption context).
  stream_kms_services = sort(distinct([
    for arn in var.stream_kms_key_arns : "kinesis.${split(":", arn)[3]}.amazonaws.com"
  ]))
  # stream_kms_keys: each key for exactly the streams that use it, through
  # Kinesis in the key's region (so streams of several regions each get their
  # own key's grant). The statement id is made of the key's region and id (a
  # Sid is alphanumeric and unique in a policy).
  stream_keys = {
    for key in distinct(values(var.stream_kms_keys)) : key => {
      sid     = "StreamKey${replace(split(":", key)[3], "-", "")}${replace(split("/", key)[1], "-", "")}"
      region  = split(":", key)[3]
      streams = sort([for stream, k in var.stream_kms_keys : stream if k == key])
    }
  }

  # What kinesumer calls on a DynamoDB table's stream (kinesis/dynamodb_streams.py),
  # authorized against the stream ARN. ListStreams (resource "*") is not
  # called: the stream is named by its ARN. Keep in sync with the
  # cross-account-role module; the tests check.
  table_stream_read_actions = [
    "dynamodb:DescribeStream",
    "dynamodb:GetRecords",
    "dynamodb:GetShardIterator",
  ]

  dead_letter_kms_services = sort(distinct([
    for arn in var.dead_letter_stream_kms_key_arns : "kinesis.${split(":", arn)[3]}.amazonaws.com"
  ]))
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

  statement {
    sid       = "StateTable"
    effect    = "Allow"
    actions   = local.dynamodb_item_actions
    resources = [var.table_arn]

    # Every key of the request (a batch has several) must be one of the apps'.
    condition {
      test     = "ForAllValues:StringLike"
      variable = "dynamodb:LeadingKeys"
      values   = local.state_table_leading_keys
    }

    # ForAllValues holds for a request without keys: require them, so that an
    # action added to this statement later without keys (Scan) is not allowed
    # on the whole table by accident.
    condition {
      test     = "Null"
      variable = "dynamodb:LeadingKeys"
      values   = ["false"]
    }
  }

  statement {
    sid       = "StateTableDescribe"
    effect    = "Allow"
    actions   = ["dynamodb:DescribeTable"]
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
        values   = sort(distinct(var.stream_arns))
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
