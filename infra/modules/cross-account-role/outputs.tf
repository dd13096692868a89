output "role_arn" {
  description = "ARN of the role: give it to the consumer as Config(role_arn=...) and to the consumer-policy module's assume_role_arns."
  value       = aws_iam_role.this.arn
}

output "role_name" {
  description = "Name of the role."
  value       = aws_iam_role.this.name
}

output "trust_policy_json" {
  description = "The rendered trust (assume-role) policy. Sensitive: it holds the external id."
  value       = data.aws_iam_policy_document.trust.json
  sensitive   = true
}

output "kinesis_policy_json" {
  description = "The rendered Kinesis read policy attached to the role."
  value       = data.aws_iam_policy_document.kinesis_read.json
}
