"""The pure core: assignment, membership/leader and shard lineage.

Nothing in this package does I/O or reads a clock: every function takes what it needs as
arguments, so every client computes the same answer from the same inputs and the functions can be
property-tested without AWS.
"""

from .assignment import Assignment, assign, shards_of
from .lineage import active_shards, has_known_parent, parents_pending
from .membership import is_leader, leader_of, live_clients, stale_clients

__all__ = [
    "Assignment",
    "active_shards",
    "assign",
    "has_known_parent",
    "is_leader",
    "leader_of",
    "live_clients",
    "parents_pending",
    "shards_of",
    "stale_clients",
]
