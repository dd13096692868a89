"""The state store on one DynamoDB table."""

from .store import DynamoDBStateStore, client_item

__all__ = ["DynamoDBStateStore", "client_item"]
