variable "region" {
  description = "The consumer's own region (Config(region=...)): the state table's, and that of streams given by name."
  type        = string
  default     = "us-east-1"
  nullable    = false
}

variable "app" {
  description = "kinesumer app name (Config(app=...)): the consumer group."
  type        = string
  nullable    = false

  validation {
    condition     = can(regex("^[a-zA-Z0-9_.-]{1,48}$", var.app))
    error_message = "app must be 1-48 characters of a-z, A-Z, 0-9, '_', '-' and '.'."
  }
}

variable "table_name" {
  description = "Name of the state table (in the consumer's account and region)."
  type        = string
  default     = "kinesumer-state"
  nullable    = false
}

variable "consumer_role_arn" {
  description = "ARN of the existing IAM role the app runs as in its own account (instance profile, ECS task role, IRSA role...): B's role trusts it, and the consumer policy is attached to it when attach_policy is true."
  type        = string
  nullable    = false

  validation {
    condition     = can(regex("^arn:aws[a-zA-Z-]*:iam::[0-9]{12}:role/[a-zA-Z0-9+=,.@_/-]+$", var.consumer_role_arn))
    error_message = "consumer_role_arn must be a full IAM role ARN (arn:<partition>:iam::<account>:role/<name>)."
  }
}

variable "attach_policy" {
  description = "Attach the consumer policy to the role of consumer_role_arn."
  type        = bool
  default     = true
  nullable    = false
}

variable "stream_arns" {
  description = "The consumer account's streams the app reads, in any of its regions (read with the app's own credentials)."
  type        = list(string)
  default     = []
  nullable    = false
}

variable "stream_kms_keys" {
  description = "Customer-managed keys of those streams, by stream ARN (each in its stream's region)."
  type        = map(string)
  default     = {}
  nullable    = false
}

variable "account_b" {
  description = <<-EOT
    The other account's streams, read through a role made there:
      profile         - AWS CLI profile with admin rights in B (null: default credentials)
      role_name       - name of the role created in B
      stream_arns     - B's streams the app reads (any of B's regions)
      stream_kms_keys - customer-managed keys of those streams, by stream ARN
  EOT
  type = object({
    profile         = optional(string)
    role_name       = optional(string, "kinesumer-reader")
    stream_arns     = list(string)
    stream_kms_keys = optional(map(string), {})
  })
  nullable = false

  validation {
    condition     = length(var.account_b.stream_arns) > 0
    error_message = "account_b.stream_arns must name at least one stream."
  }

  validation {
    # One role reads one account's streams.
    condition     = length(distinct([for arn in var.account_b.stream_arns : split(":", arn)[4]])) == 1
    error_message = "account_b.stream_arns must all be streams of one account."
  }
}

variable "account_b_external_id" {
  description = "The external id the app presents to B's role (AccountAccess(external_id=...)). Sensitive: kept apart from account_b so that only it is hidden."
  type        = string
  nullable    = false
  sensitive   = true
}

variable "tags" {
  description = "Tags applied to every resource."
  type        = map(string)
  default     = {}
  nullable    = false
}
