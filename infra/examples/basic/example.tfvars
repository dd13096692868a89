# terraform plan -var-file=example.tfvars
region     = "eu-west-1"
app        = "orders-etl"
table_name = "kinesumer-state"

stream_arns = [
  "arn:aws:kinesis:eu-west-1:111111111111:stream/orders",
  "arn:aws:kinesis:eu-west-1:111111111111:stream/payments",
]

consumer_role_name = "orders-etl-task"

# Uncomment when the streams are in another account (here 222222222222 holds
# the streams; the stream ARNs above must then name that account):
# cross_account = {
#   profile             = "streams-admin"
#   external_id         = "orders-etl-7c1f"
#   consumer_principals = ["arn:aws:iam::111111111111:role/orders-etl-task"]
# }
