output "policy_json" {
  description = "The policy document (JSON), to attach inline or to a role of your own."
  value       = data.aws_iam_policy_document.this.json
}

output "policy_arn" {
  description = "ARN of the created policy (null when name is null)."
  value       = one(aws_iam_policy.this[*].arn)
}
