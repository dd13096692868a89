output "policy_json" {
  description = "The rendered IAM policy document (JSON)."
  value       = data.aws_iam_policy_document.this.json
}

output "policy_arn" {
  description = "ARN of the created IAM policy; null when create_policy is false."
  value       = one(aws_iam_policy.this[*].arn)
}

output "policy_name" {
  description = "Name of the created IAM policy; null when create_policy is false."
  value       = one(aws_iam_policy.this[*].name)
}
