variable "name" {
  description = "Name of the DynamoDB table. One table serves any number of kinesumer apps (items are keyed by app), so one per account and region is usually enough."
  type        = string

  validation {
    # DynamoDB's own rule for table names.
    condition     = can(regex("^[a-zA-Z0-9_.-]{3,255}$", var.name))
    error_message = "name must be 3-255 characters of a-z, A-Z, 0-9, '_', '-' and '.'."
  }
}

variable "billing_mode" {
  description = "PAY_PER_REQUEST (on-demand, the default: consumer groups write in bursts on rebalance) or PROVISIONED (then read_capacity and write_capacity are required)."
  type        = string
  default     = "PAY_PER_REQUEST"
  nullable    = false

  validation {
    condition     = contains(["PAY_PER_REQUEST", "PROVISIONED"], var.billing_mode)
    error_message = "billing_mode must be PAY_PER_REQUEST or PROVISIONED."
  }
}

variable "read_capacity" {
  description = "Provisioned read capacity units. Required when billing_mode is PROVISIONED, must be null otherwise."
  type        = number
  default     = null

  validation {
    condition = (
      var.billing_mode == "PROVISIONED"
      ? try(var.read_capacity >= 1 && floor(var.read_capacity) == var.read_capacity, false)
      : var.read_capacity == null
    )
    error_message = "read_capacity must be a whole number >= 1 when billing_mode is PROVISIONED, and null when it is PAY_PER_REQUEST."
  }
}

variable "write_capacity" {
  description = "Provisioned write capacity units. Required when billing_mode is PROVISIONED, must be null otherwise."
  type        = number
  default     = null

  validation {
    condition = (
      var.billing_mode == "PROVISIONED"
      ? try(var.write_capacity >= 1 && floor(var.write_capacity) == var.write_capacity, false)
      : var.write_capacity == null
    )
    error_message = "write_capacity must be a whole number >= 1 when billing_mode is PROVISIONED, and null when it is PAY_PER_REQUEST."
  }
}

variable "point_in_time_recovery" {
  description = "Enable point-in-time recovery. On by default: the table holds every app's checkpoints, and losing them means re-reading streams from the initial position."
  type        = bool
  default     = true
  nullable    = false
}

variable "kms_key_arn" {
  description = "ARN of a customer-managed KMS key for server-side encryption. null (the default) keeps the AWS-owned key, which costs nothing and needs no key policy. Consumers then also need KMS rights on this key (see the consumer-policy module's table_kms_key_arn)."
  type        = string
  default     = null

  validation {
    condition     = var.kms_key_arn == null || can(regex("^arn:aws[a-zA-Z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[a-zA-Z0-9-]+$", var.kms_key_arn))
    error_message = "kms_key_arn must be null or a KMS key ARN (arn:<partition>:kms:<region>:<account>:key/<id>); aliases are not accepted because DynamoDB stores the resolved key."
  }
}

variable "deletion_protection" {
  description = "Enable DynamoDB deletion protection. On by default: destroying the table drops every consumer group's checkpoints."
  type        = bool
  default     = true
  nullable    = false
}

variable "tags" {
  description = "Tags applied to the table."
  type        = map(string)
  default     = {}
  nullable    = false
}
