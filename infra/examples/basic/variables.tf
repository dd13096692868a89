variable "region" {
  description = "AWS region of the consumer (and of the state table)."
  type        = string
  default     = "eu-west-1"
  nullable    = false
}

variable "app" {
  description = "kinesumer app name (Config(app=...)): the consumer group. Used in names and tags here; the table itself is shared by all apps."
  type        = string
  nullable    = false

  validation {
    condition     = can(regex("^[a-zA-Z0-9_.-]{1,48}$", var.app))
    error_message = "app must be 1-48 characters of a-z, A-Z, 0-9, '_', '-' and '.'."
  }
}

variable "table_name" {
  description = "Name of the state table."
  type        = string
  default     = "kinesumer-state"
  nullable    = false
}

variable "stream_arns" {
  description = "ARNs of the streams the app consumes (two in example.tfvars). The streams belong to their producers and already exist, so they are inputs rather than resources here."
  type        = list(string)
  nullable    = false

  validation {
    condition     = length(var.stream_arns) > 0
    error_message = "stream_arns must name at least one stream."
  }
}

variable "consumer_role_name" {
  description = "Name of an existing IAM role the consumer runs as (instance profile, ECS task role, IRSA role...). The consumer policy is attached to it; null: create the policy only."
  type        = string
  default     = null
}

variable "cross_account" {
  description = <<-EOT
    Set when the streams live in another account. Terraform then creates the
    reader role there (through the aws.stream_account provider) and the
    consumer gets sts:AssumeRole on it instead of direct Kinesis rights.
      profile             - AWS CLI profile with admin rights in the stream account (null: default credentials)
      role_name           - name of the role created in the stream account
      external_id         - the external id the consumer presents (Config(external_id=...))
      consumer_principals - role ARNs allowed to assume the role (no bare accounts)
  EOT
  type = object({
    profile             = optional(string)
    role_name           = optional(string, "kinesumer-reader")
    external_id         = string
    consumer_principals = list(string)
  })
  default = null
}

variable "tags" {
  description = "Tags applied to every resource."
  type        = map(string)
  default     = {}
  nullable    = false
}
