provider "aws" {
  region = var.region
}

# The streams' account. Only used when var.cross_account is set; otherwise no
# resource refers to it and Terraform never configures it.
provider "aws" {
  alias   = "stream_account"
  region  = var.region
  profile = try(var.cross_account.profile, null)
}

locals {
  tags = merge({ "kinesumer:app" = var.app }, var.tags)
}

module "state_table" {
  source = "../../modules/state-table"

  name = var.table_name
  tags = local.tags
}

module "reader_role" {
  source = "../../modules/cross-account-role"
  count  = var.cross_account == null ? 0 : 1

  providers = {
    aws = aws.stream_account
  }

  name                = var.cross_account.role_name
  external_id         = var.cross_account.external_id
  consumer_principals = var.cross_account.consumer_principals
  stream_arns         = var.stream_arns
  tags                = local.tags
}

module "consumer_policy" {
  source = "../../modules/consumer-policy"

  # Cross-account: Kinesis is read with the role's credentials, so the
  # consumer's own policy needs only sts:AssumeRole for it.
  stream_arns      = var.cross_account == null ? var.stream_arns : []
  assume_role_arns = module.reader_role[*].role_arn
  apps             = [var.app] # item access to this app's keys only
  table_arn        = module.state_table.table_arn
  policy_name      = "kinesumer-${var.app}"
  tags             = local.tags
}

resource "aws_iam_role_policy_attachment" "consumer" {
  count = var.consumer_role_name == null ? 0 : 1

  role       = var.consumer_role_name
  policy_arn = module.consumer_policy.policy_arn
}
