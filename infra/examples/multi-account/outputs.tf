output "table_name" {
  description = "Config(dynamodb_table=...)."
  value       = module.state_table.table_name
}

output "consumer_policy_arn" {
  description = "ARN of the consumer's IAM policy."
  value       = module.consumer_policy.policy_arn
}

output "reader_role_arn" {
  description = "The role in B: AccountAccess(role_arn=...) for B in Config(accounts=...)."
  value       = module.reader_role_b.role_arn
}

output "accounts" {
  description = "Config(accounts=...) without the external id: { <B's account id> = { role_arn } }."
  value       = { (local.account_b) = { role_arn = module.reader_role_b.role_arn } }
}
