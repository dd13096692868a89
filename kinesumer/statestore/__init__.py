"""Where the group's state lives: the interface, and its DynamoDB implementation."""

from .base import GroupState, ShardCache, StateStore
from .dynamodb.store import DynamoDBStateStore

__all__ = ["DynamoDBStateStore", "GroupState", "ShardCache", "StateStore"]
