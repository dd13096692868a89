# One app, three streams: `orders` in the consumer's account (A) in two regions,
# read with the app's own credentials, and `orders` in account B, read through
# a role in B (Config(accounts={B: AccountAccess(role_arn=..., external_id=...)})).
# The state table stays in A, in var.region.

provider "aws" {
  region = var.region
}

# Account B, where the reader role is made (IAM is global: the region only
# picks the endpoint). An AWS CLI profile; replace it with an assume_role
# block if that is how you reach B.
provider "aws" {
  alias   = "account_b"
  region  = var.region
  profile = var.account_b.profile
}

locals {
  tags = merge({ "kinesumer:app" = var.app }, var.tags)

  # Account ids, from the ARNs given (no lookup).
  consumer_account = split(":", var.consumer_role_arn)[4]
  account_b        = split(":", var.account_b.stream_arns[0])[4]
}

module "state_table" {
  source = "../../modules/state-table"

  name = var.table_name
  tags = local.tags
}

# In B: trusts the app's role in A, with A's external id, and reads B's streams.
module "reader_role_b" {
  source = "../../modules/cross-account-role"

  providers = {
    aws = aws.account_b
  }

  name = var.account_b.role_name
  consumer_accounts = {
    (local.consumer_account) = {
      principals  = [var.consumer_role_arn]
      external_id = var.account_b_external_id
    }
  }
  stream_arns     = var.account_b.stream_arns
  stream_kms_keys = var.account_b.stream_kms_keys
  tags            = local.tags
}

# In A: Kinesis on A's streams (both regions), the state table, and
# sts:AssumeRole on B's role; nothing on B's streams (the role has those).
module "consumer_policy" {
  source = "../../modules/consumer-policy"

  apps             = [var.app]
  stream_arns      = var.stream_arns
  stream_kms_keys  = var.stream_kms_keys
  assume_role_arns = [module.reader_role_b.role_arn]
  table_arn        = module.state_table.table_arn
  policy_name      = "kinesumer-${var.app}"
  tags             = local.tags
}

resource "aws_iam_role_policy_attachment" "consumer" {
  count = var.attach_policy ? 1 : 0

  # The role's name is the last part of its ARN (after any path).
  role       = element(split("/", var.consumer_role_arn), length(split("/", var.consumer_role_arn)) - 1)
  policy_arn = module.consumer_policy.policy_arn
}
