terraform {
  # 1.9 is the first release whose variable validations may refer to other
  # variables (capacities are checked against billing_mode).
  required_version = ">= 1.9.0"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.0"
    }
  }
}
