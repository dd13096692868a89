output "table_name" {
  description = "Config(dynamodb_table=...)."
  value       = module.state_table.table_name
}

output "table_arn" {
  description = "ARN of the state table."
  value       = module.state_table.table_arn
}

output "consumer_policy_arn" {
  description = "ARN of the consumer's IAM policy."
  value       = module.consumer_policy.policy_arn
}

output "reader_role_arn" {
  description = "Config(role_arn=...) when the streams are in another account; null otherwise."
  value       = one(module.reader_role[*].role_arn)
}
