variable "stream_arns" {
  description = "ARNs of the Kinesis streams the principal puts to: a Producer's streams, or the streams an outbox relay may write (the same list as the relay's --streams)."
  type        = list(string)
  nullable    = false

  validation {
    condition     = length(var.stream_arns) > 0
    error_message = "stream_arns must name at least one stream."
  }

  validation {
    # Full stream ARNs only: a wildcard here would let any row of an outbox
    # (each row names its stream) reach every stream in the account.
    condition = alltrue([
      for arn in var.stream_arns :
      can(regex("^arn:aws[a-zA-Z-]*:kinesis:[a-z0-9-]+:[0-9]{12}:stream/[a-zA-Z0-9_.-]{1,128}$", arn))
    ])
    error_message = "Each stream_arns entry must be a full Kinesis stream ARN (arn:<partition>:kinesis:<region>:<account>:stream/<name>), without wildcards."
  }
}

variable "stream_kms_key_arns" {
  description = "Customer-managed KMS keys of the streams in stream_arns that use server-side encryption with such a key (PutRecords then needs kms:GenerateDataKey, granted only through Kinesis in the key's region and only for the streams in stream_arns). Streams encrypted with the AWS-managed aws/kinesis key need nothing here."
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

variable "name" {
  description = "Name of the IAM policy to create (null: only render the document, output policy_json)."
  type        = string
  default     = null
}
