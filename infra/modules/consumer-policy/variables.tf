variable "stream_arns" {
  description = "ARNs of the Kinesis streams the consumer reads directly with its own credentials: its own account's, in any of its regions (Config(accounts=...) sends another account's calls through that account's role: list those roles in assume_role_arns instead)."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    # Full stream ARNs only: a wildcard here would widen the grant to every
    # stream in the account.
    condition = alltrue([
      for arn in var.stream_arns :
      can(regex("^arn:aws[a-zA-Z-]*:kinesis:[a-z0-9-]+:[0-9]{12}:stream/[a-zA-Z0-9_.-]{1,128}$", arn))
    ])
    error_message = "Each stream_arns entry must be a full Kinesis stream ARN (arn:<partition>:kinesis:<region>:<account>:stream/<name>), without wildcards."
  }
}

variable "apps" {
  description = "The kinesumer apps (Config(app=...)) that run with this policy. Item access to the state table is limited to these apps' own keys (dynamodb:LeadingKeys), so an app cannot read or rewrite another app's members, checkpoints or shard caches in a shared table."
  type        = list(string)
  nullable    = false

  validation {
    condition     = length(var.apps) > 0
    error_message = "apps must name at least one kinesumer app (Config(app=...))."
  }

  validation {
    # Config's own rule: no '#' (the key separator), no IAM wildcard.
    condition     = alltrue([for app in var.apps : can(regex("^[A-Za-z0-9_.-]+$", app))])
    error_message = "Each apps entry must be an app name as Config accepts it: letters, digits, '_', '.', '-'."
  }

  validation {
    # "<app>.spark-<query>" is a Spark query's own group of app <app>, admitted by
    # <app>'s grants (spark_query_groups): an app of that name would share them.
    condition     = alltrue([for app in var.apps : !strcontains(app, ".spark-")])
    error_message = "apps must not contain \".spark-\": names of that form belong to the Spark queries of the app before it."
  }
}

variable "table_arn" {
  description = "ARN of the kinesumer state table (output table_arn of the state-table module)."
  type        = string

  validation {
    condition     = can(regex("^arn:aws[a-zA-Z-]*:dynamodb:[a-z0-9-]+:[0-9]{12}:table/[a-zA-Z0-9_.-]{3,255}$", var.table_arn))
    error_message = "table_arn must be a full DynamoDB table ARN (arn:<partition>:dynamodb:<region>:<account>:table/<name>), without wildcards."
  }
}

variable "table_kms_key_arn" {
  description = "Customer-managed KMS key of the state table, if any (the state-table module's kms_key_arn). Grants the key use DynamoDB needs on the caller's behalf, only through DynamoDB. null for the AWS-owned key."
  type        = string
  default     = null

  validation {
    condition     = var.table_kms_key_arn == null || can(regex("^arn:aws[a-zA-Z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[a-zA-Z0-9-]+$", var.table_kms_key_arn))
    error_message = "table_kms_key_arn must be null or a KMS key ARN (arn:<partition>:kms:<region>:<account>:key/<id>)."
  }
}

variable "stream_kms_key_arns" {
  description = "Customer-managed KMS keys of the streams in stream_arns that use server-side encryption with such a key (GetRecords then needs kms:Decrypt, granted only through Kinesis in the key's region and only for the streams in stream_arns). Streams encrypted with the AWS-managed aws/kinesis key need nothing here."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition = alltrue([
      for arn in var.stream_kms_key_arns :
      can(regex("^arn:aws[a-zA-Z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[a-zA-Z0-9-]+$", arn))
    ])
    error_message = "Each stream_kms_key_arns entry must be a KMS key ARN (arn:<partition>:kms:<region>:<account>:key/<id>)."
  }

  validation {
    # The grant is conditioned on the streams' ARNs (the encryption context).
    condition     = length(var.stream_kms_key_arns) == 0 || length(var.stream_arns) > 0
    error_message = "stream_kms_key_arns needs stream_arns: the keys are granted for those streams only (streams read through a cross-account role get their keys from that role)."
  }
}

variable "dead_letter_stream_kms_key_arns" {
  description = "Customer-managed KMS keys of the streams in dead_letter_stream_arns that use server-side encryption with such a key (PutRecord then needs kms:GenerateDataKey, granted only through Kinesis in the key's region and only for those streams)."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition = alltrue([
      for arn in var.dead_letter_stream_kms_key_arns :
      can(regex("^arn:aws[a-zA-Z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[a-zA-Z0-9-]+$", arn))
    ])
    error_message = "Each dead_letter_stream_kms_key_arns entry must be a KMS key ARN (arn:<partition>:kms:<region>:<account>:key/<id>)."
  }

  validation {
    condition     = length(var.dead_letter_stream_kms_key_arns) == 0 || length(var.dead_letter_stream_arns) > 0
    error_message = "dead_letter_stream_kms_key_arns needs dead_letter_stream_arns: the keys are granted for those streams only."
  }
}

variable "assume_role_arns" {
  description = "ARNs of roles in other accounts that the consumer assumes to read their streams (Config(role_arn=...)); typically the role_arn output of the cross-account-role module. Empty: no sts:AssumeRole grant."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition = alltrue([
      for arn in var.assume_role_arns :
      can(regex("^arn:aws[a-zA-Z-]*:iam::[0-9]{12}:role/[a-zA-Z0-9+=,.@_/-]+$", arn))
    ])
    error_message = "Each assume_role_arns entry must be a full IAM role ARN (arn:<partition>:iam::<account>:role/<name>), without wildcards."
  }

  validation {
    # A consumer must read streams somehow: directly or through a role.
    condition     = length(var.assume_role_arns) + length(var.stream_arns) + length(var.table_stream_arns) > 0
    error_message = "Give at least one of stream_arns (streams read directly), table_stream_arns (DynamoDB table streams) or assume_role_arns (streams read through a cross-account role)."
  }
}

variable "create_policy" {
  description = "Create an aws_iam_policy from the document. false: only render the JSON (output policy_json), e.g. to embed it in an inline role policy."
  type        = bool
  default     = true
  nullable    = false
}

variable "policy_name" {
  description = "Name of the created IAM policy. null: a unique name starting with \"kinesumer-consumer-\"."
  type        = string
  default     = null
}

variable "policy_path" {
  description = "IAM path of the created policy."
  type        = string
  default     = "/"
  nullable    = false
}

variable "description" {
  description = "Description of the created IAM policy."
  type        = string
  default     = "kinesumer consumer: read the named Kinesis streams and use the kinesumer state table"
  nullable    = false
}

variable "tags" {
  description = "Tags applied to the created IAM policy."
  type        = map(string)
  default     = {}
  nullable    = false
}

variable "dead_letter_stream_arns" {
  description = "ARNs of the Kinesis streams the consumer's handlers write failed records to (handlers' DeadLetter and RetryLater policies): kinesis:PutRecord on these only. A RetryLater stream is read again by the group: list it in stream_arns too. Empty: no write grant."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition = alltrue([
      for arn in var.dead_letter_stream_arns :
      can(regex("^arn:aws[a-zA-Z-]*:kinesis:[a-z0-9-]+:[0-9]{12}:stream/[a-zA-Z0-9_.-]{1,128}$", arn))
    ])
    error_message = "Each dead_letter_stream_arns entry must be a full Kinesis stream ARN (arn:<partition>:kinesis:<region>:<account>:stream/<name>), without wildcards."
  }
}

variable "enhanced_fan_out" {
  description = "Grant what Config(enhanced_fan_out=True) needs: kinesis:RegisterStreamConsumer on the streams, and kinesis:DescribeStreamConsumer and kinesis:SubscribeToShard on the consumer named consumer_name of each stream. false (default): no enhanced fan-out grant."
  type        = bool
  default     = false
  nullable    = false
}

variable "consumer_name" {
  description = "With enhanced_fan_out: the stream consumer the members read through (Config.consumer_name, which defaults to the app's name). The grant covers that consumer on each stream, whatever its creation timestamp (a consumer ARN ends with it)."
  type        = string
  default     = null

  validation {
    condition     = var.consumer_name == null || can(regex("^[a-zA-Z0-9_.-]{1,128}$", var.consumer_name))
    error_message = "consumer_name must be 1-128 of [a-zA-Z0-9_.-], as RegisterStreamConsumer accepts."
  }

  validation {
    condition     = !var.enhanced_fan_out || var.consumer_name != null
    error_message = "enhanced_fan_out = true needs consumer_name (Config.consumer_name, or the app's name)."
  }
}

variable "spark_query_groups" {
  description = "Whether the apps' Spark streaming queries may keep their own consumer groups (\"<app>.spark-<query>\": each query reads the whole stream, the source's default). false: only the apps' own keys, for queries run with shared_group=true or no Spark at all."
  type        = bool
  default     = true
  nullable    = false
}

variable "stream_kms_keys" {
  description = "Customer-managed KMS key of each stream in stream_arns that uses one, by stream ARN: { \"<stream ARN>\" = \"<key ARN>\" }. Each key gets kms:Decrypt through Kinesis in its region, for exactly the streams mapped to it (tighter than stream_kms_key_arns, whose keys are granted for every stream in stream_arns): the form for streams of several regions."
  type        = map(string)
  default     = {}
  nullable    = false

  validation {
    condition     = alltrue([for stream in keys(var.stream_kms_keys) : contains(var.stream_arns, stream)])
    error_message = "Each stream_kms_keys key must be one of stream_arns: a key is granted for the streams read directly only (a cross-account role grants its streams' keys)."
  }

  validation {
    # A stream's key is in the stream's region (KMS keys are regional). try():
    # Terraform's && evaluates both sides, and a key that is no ARN has no
    # region to split out.
    condition = alltrue([
      for stream, key in var.stream_kms_keys :
      can(regex("^arn:aws[a-zA-Z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[a-zA-Z0-9-]+$", key)) && try(split(":", key)[3] == split(":", stream)[3], false)
    ])
    error_message = "Each stream_kms_keys value must be a KMS key ARN (arn:<partition>:kms:<region>:<account>:key/<id>) in its stream's region."
  }
}

variable "table_stream_arns" {
  description = "ARNs of DynamoDB table streams the consumer reads (arn:<partition>:dynamodb:<region>:<account>:table/<table>/stream/<label>): dynamodb:DescribeStream, GetShardIterator and GetRecords on these only. Read with the member's own credentials."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition = alltrue([
      for arn in var.table_stream_arns :
      can(regex("^arn:aws[a-zA-Z-]*:dynamodb:[a-z0-9-]+:[0-9]{12}:table/[a-zA-Z0-9_.-]{3,255}/stream/[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}[.][0-9]{3}$", arn))
    ])
    error_message = "Each table_stream_arns entry must be a full DynamoDB table stream ARN (arn:<partition>:dynamodb:<region>:<account>:table/<table>/stream/<label>), without wildcards."
  }
}
