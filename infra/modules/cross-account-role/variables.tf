variable "name" {
  description = "Name of the role (created in the stream's account)."
  type        = string

  validation {
    condition     = can(regex("^[a-zA-Z0-9+=,.@_-]{1,64}$", var.name))
    error_message = "name must be 1-64 characters of a-z, A-Z, 0-9 and +=,.@_-."
  }
}

variable "path" {
  description = "IAM path of the role."
  type        = string
  default     = "/"
  nullable    = false
}

variable "description" {
  description = "Description of the role."
  type        = string
  default     = "Assumed by kinesumer consumers in another account to read Kinesis streams"
  nullable    = false
}

variable "consumer_principals" {
  description = "Who may assume the role: IAM role (or user) ARNs of the consumers. Whole accounts (12-digit ids, :root ARNs) are refused: they would trust every principal the account allows. For roles whose names vary use consumer_principal_arn_patterns."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition = alltrue([
      for p in var.consumer_principals :
      can(regex("^arn:aws[a-zA-Z-]*:iam::[0-9]{12}:(role|user)/[a-zA-Z0-9+=,.@_/-]+$", p))
    ])
    error_message = "Each consumer_principals entry must be an IAM role or user ARN (arn:<partition>:iam::<account>:role/<name> or user/<name>), without wildcards; not an account id or :root."
  }
}

variable "consumer_principal_arn_patterns" {
  description = "IAM role ARN patterns (ArnLike: '*' and '?' in the role name only) of consumers whose role names vary, e.g. arn:aws:iam::111111111111:role/orders-etl-*. The trust policy names their accounts as principals with an aws:PrincipalArn condition on these patterns."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition = alltrue([
      for p in var.consumer_principal_arn_patterns :
      can(regex("^arn:aws[a-zA-Z-]*:iam::[0-9]{12}:role/[a-zA-Z0-9+=,.@_/*?-]+$", p)) && !can(regex("^arn:[^:]+:iam::[0-9]{12}:role/[*?/]*$", p))
    ])
    error_message = "Each consumer_principal_arn_patterns entry must be an IAM role ARN pattern with a 12-digit account and a role name that is not only wildcards (arn:<partition>:iam::<account>:role/<name with * or ?>)."
  }

  validation {
    condition     = length(var.consumer_principal_arn_patterns) + length(var.consumer_principals) > 0
    error_message = "Give at least one of consumer_principals (role ARNs) or consumer_principal_arn_patterns."
  }
}

variable "external_id" {
  description = "External id the consumer must present (Config(external_id=...)). Required: without it any principal of a trusted account could use the role on another party's behalf (the confused-deputy problem). Sensitive: kept out of plan output and logs (the trust_policy_json output is sensitive too)."
  type        = string
  nullable    = false
  sensitive   = true

  validation {
    # STS limits: 2-1224 characters of [\w+=,.@:/-]. The length is checked
    # apart because RE2 (Terraform's regex engine) caps repeat counts at 1000.
    condition = (
      length(var.external_id) >= 2 && length(var.external_id) <= 1224
      && can(regex("^[a-zA-Z0-9_+=,.@:/-]+$", var.external_id))
    )
    error_message = "external_id must be non-empty: 2-1224 characters of a-z, A-Z, 0-9 and _+=,.@:/-."
  }
}

variable "stream_arns" {
  description = "ARNs of the Kinesis streams (in this account) the role may read."
  type        = list(string)
  nullable    = false

  validation {
    condition     = length(var.stream_arns) > 0
    error_message = "stream_arns must name at least one stream."
  }

  validation {
    condition = alltrue([
      for arn in var.stream_arns :
      can(regex("^arn:aws[a-zA-Z-]*:kinesis:[a-z0-9-]+:[0-9]{12}:stream/[a-zA-Z0-9_.-]{1,128}$", arn))
    ])
    error_message = "Each stream_arns entry must be a full Kinesis stream ARN (arn:<partition>:kinesis:<region>:<account>:stream/<name>), without wildcards."
  }
}

variable "stream_kms_key_arns" {
  description = "Customer-managed KMS keys of streams that use one for server-side encryption (GetRecords needs kms:Decrypt, granted only through Kinesis in the key's region and only for the streams in stream_arns). The key policy must also allow this role."
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

variable "max_session_duration" {
  description = "Maximum session length in seconds (3600-43200). kinesumer refreshes its credentials before they expire, so the 1-hour default is enough; raise it only to cut STS calls."
  type        = number
  default     = 3600
  nullable    = false

  validation {
    condition     = var.max_session_duration >= 3600 && var.max_session_duration <= 43200 && floor(var.max_session_duration) == var.max_session_duration
    error_message = "max_session_duration must be a whole number of seconds between 3600 and 43200."
  }
}

variable "permissions_boundary" {
  description = "ARN of a permissions boundary policy for the role, if the account requires one."
  type        = string
  default     = null
}

variable "tags" {
  description = "Tags applied to the role."
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
