# terraform plan -var-file=example.tfvars
# The app runs in account 123456789012 (A) and reads `orders` in A's us-east-1
# and eu-west-1 and in 111111111111's (B's) us-east-1.
region            = "us-east-1"
app               = "orders-etl"
table_name        = "kinesumer-state"
consumer_role_arn = "arn:aws:iam::123456789012:role/orders-etl-task"

stream_arns = [
  "arn:aws:kinesis:us-east-1:123456789012:stream/orders",
  "arn:aws:kinesis:eu-west-1:123456789012:stream/orders",
]

account_b = {
  profile     = "account-b-admin"
  stream_arns = ["arn:aws:kinesis:us-east-1:111111111111:stream/orders"]
}

# Better given apart (TF_VAR_account_b_external_id), as a secret:
account_b_external_id = "orders-etl-7c1f"
