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
    condition     = length(var.consumer_principal_arn_patterns) + length(var.consumer_principals) + length(var.consumer_accounts) > 0
    error_message = "Give at least one of consumer_principals (role ARNs), consumer_principal_arn_patterns or consumer_accounts."
  }
}

variable "external_id" {
  description = "External id the consumers must present (Config(external_id=...), or AccountAccess(external_id=...) for this account). Required for consumer_principals and consumer_principal_arn_patterns, and for each consumer_accounts entry without an external_id of its own: without it any principal of a trusted account could use the role on another party's behalf (the confused-deputy problem). Sensitive: kept out of plan output and logs (the trust_policy_json output is sensitive too)."
  type        = string
  default     = null
  sensitive   = true

  validation {
    # STS limits: 2-1224 characters of [\w+=,.@:/-]. The length is checked
    # apart because RE2 (Terraform's regex engine) caps repeat counts at 1000.
    condition = var.external_id == null || (
      length(coalesce(var.external_id, "-")) >= 2 && length(coalesce(var.external_id, "-")) <= 1224
      && can(regex("^[a-zA-Z0-9_+=,.@:/-]+$", coalesce(var.external_id, "-")))
    )
    error_message = "external_id must be non-empty: 2-1224 characters of a-z, A-Z, 0-9 and _+=,.@:/-."
  }

  validation {
    # Every trust statement carries an external id: the principals named
    # outside consumer_accounts have no other. (Checked here rather than on
    # consumer_accounts: validations referring to each other's variables would
    # make a cycle.)
    condition = var.external_id != null || (
      length(var.consumer_principals) + length(var.consumer_principal_arn_patterns) == 0
      && alltrue([for c in values(var.consumer_accounts) : c.external_id != null])
    )
    error_message = "external_id is required with consumer_principals or consumer_principal_arn_patterns, and for each consumer_accounts entry without an external_id of its own."
  }
}

variable "consumer_accounts" {
  description = <<-EOT
    Consumer accounts trusted, each with its own principals and, optionally, its
    own external id (one application per account usually has its own), keyed by
    the 12-digit account id:
      principals             - role (or user) ARNs of that account
      principal_arn_patterns - role ARN patterns of that account (ArnLike on aws:PrincipalArn)
      external_id            - the external id that account's consumers present; null: external_id
    A whole account is never trusted: each entry names roles. Sensitive: it
    holds external ids.
  EOT
  type = map(object({
    principals             = optional(list(string), [])
    principal_arn_patterns = optional(list(string), [])
    external_id            = optional(string)
  }))
  default   = {}
  nullable  = false
  sensitive = true

  validation {
    condition     = alltrue([for account in keys(var.consumer_accounts) : can(regex("^[0-9]{12}$", account))])
    error_message = "Each consumer_accounts key must be a 12-digit AWS account id."
  }

  validation {
    condition = alltrue([
      for c in values(var.consumer_accounts) : length(c.principals) + length(c.principal_arn_patterns) > 0
    ])
    error_message = "Each consumer_accounts entry must name principals or principal_arn_patterns: a whole account is never trusted."
  }

  validation {
    condition = alltrue(flatten([
      for account, c in var.consumer_accounts : [
        for p in c.principals :
        can(regex("^arn:aws[a-zA-Z-]*:iam::${account}:(role|user)/[a-zA-Z0-9+=,.@_/-]+$", p))
      ]
    ]))
    error_message = "Each consumer_accounts principals entry must be an IAM role or user ARN of that entry's account (arn:<partition>:iam::<account>:role/<name> or user/<name>), without wildcards; not :root."
  }

  validation {
    condition = alltrue(flatten([
      for account, c in var.consumer_accounts : [
        for p in c.principal_arn_patterns :
        can(regex("^arn:aws[a-zA-Z-]*:iam::${account}:role/[a-zA-Z0-9+=,.@_/*?-]+$", p)) && !can(regex("^arn:[^:]+:iam::[0-9]{12}:role/[*?/]*$", p))
      ]
    ]))
    error_message = "Each consumer_accounts principal_arn_patterns entry must be an IAM role ARN pattern of that entry's account with a role name that is not only wildcards (arn:<partition>:iam::<account>:role/<name with * or ?>)."
  }

  validation {
    condition = alltrue([
      for c in values(var.consumer_accounts) :
      c.external_id == null || (
        length(coalesce(c.external_id, "-")) >= 2 && length(coalesce(c.external_id, "-")) <= 1224
        && can(regex("^[a-zA-Z0-9_+=,.@:/-]+$", coalesce(c.external_id, "-")))
      )
    ])
    error_message = "Each consumer_accounts external_id must be null or 2-1224 characters of a-z, A-Z, 0-9 and _+=,.@:/-."
  }

}

variable "stream_arns" {
  description = "ARNs of the Kinesis streams the role may read: this account's, in any of its regions."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition     = length(var.stream_arns) + length(flatten(values(var.stream_names))) + length(var.table_stream_arns) > 0
    error_message = "Give at least one of stream_arns, stream_names or table_stream_arns: the role must read some stream."
  }

  validation {
    condition = alltrue([
      for arn in var.stream_arns :
      can(regex("^arn:aws[a-zA-Z-]*:kinesis:[a-z0-9-]+:[0-9]{12}:stream/[a-zA-Z0-9_.-]{1,128}$", arn))
    ])
    error_message = "Each stream_arns entry must be a full Kinesis stream ARN (arn:<partition>:kinesis:<region>:<account>:stream/<name>), without wildcards."
  }
}

variable "stream_names" {
  description = "Kinesis streams of this account the role may read, by name, keyed by region: { \"us-east-1\" = [\"orders\"], \"eu-west-1\" = [\"orders\"] }. Made into ARNs with the account the provider runs in (data.aws_caller_identity, read only when this is set). Grants the same as stream_arns."
  type        = map(list(string))
  default     = {}
  nullable    = false

  validation {
    condition     = alltrue([for region in keys(var.stream_names) : can(regex("^[a-z]{2}(-[a-z]+)+-[0-9]+$", region))])
    error_message = "Each stream_names key must be an AWS region name (us-east-1, eu-west-1 ...)."
  }

  validation {
    condition     = alltrue([for name in flatten(values(var.stream_names)) : can(regex("^[a-zA-Z0-9_.-]{1,128}$", name))])
    error_message = "Each stream_names entry must be a stream name: 1-128 of [a-zA-Z0-9_.-], no wildcards."
  }
}

variable "table_stream_arns" {
  description = "ARNs of DynamoDB table streams (arn:<partition>:dynamodb:<region>:<account>:table/<table>/stream/<label>) of this account the role may read: dynamodb:DescribeStream, GetShardIterator and GetRecords on these only."
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

variable "stream_kms_keys" {
  description = "Customer-managed KMS key of each stream in stream_arns that uses one, by stream ARN: { \"<stream ARN>\" = \"<key ARN>\" }. Each key gets kms:Decrypt through Kinesis in its region, for exactly the streams mapped to it (tighter than stream_kms_key_arns, whose keys are granted for every stream read). The key policy must also allow this role."
  type        = map(string)
  default     = {}
  nullable    = false

  validation {
    condition     = alltrue([for stream in keys(var.stream_kms_keys) : contains(var.stream_arns, stream)])
    error_message = "Each stream_kms_keys key must be one of stream_arns: a key is granted for the streams read only."
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
