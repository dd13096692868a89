output "table_name" {
  description = "Name of the state table: pass it to kinesumer as Config(dynamodb_table=...)."
  value       = aws_dynamodb_table.this.name
}

output "table_arn" {
  description = "ARN of the state table: pass it to the consumer-policy module."
  value       = aws_dynamodb_table.this.arn
}
