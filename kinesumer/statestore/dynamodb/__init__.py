"""The state store on one DynamoDB table: table calls (:mod:`.table`), item codecs
(:mod:`.codecs`), the chunked shard cache (:mod:`.shard_cache`), and the store that wires them
(:mod:`.store`)."""

from .codecs import client_item
from .store import DynamoDBStateStore

__all__ = ["DynamoDBStateStore", "client_item"]
