"""The pure core: assignment (range and sticky), liveness, membership/leader and shard lineage.

Nothing in this package does I/O or reads a clock: every function takes what it needs as
arguments, so every client computes the same answer from the same inputs and the functions can be
property-tested without AWS.
"""

from .assignment import ASSIGNMENT_MODES, Assignment, assign, group_mode, shards_of
from .lineage import active_shards, has_known_parent, parents_pending
from .membership import is_leader, leader_of, live_clients, stale_clients
from .sticky import Owners, sticky_assign, sticky_shards_of

__all__ = [
    "ASSIGNMENT_MODES",
    "Assignment",
    "Owners",
    "active_shards",
    "assign",
    "group_mode",
    "has_known_parent",
    "is_leader",
    "leader_of",
    "live_clients",
    "parents_pending",
    "shards_of",
    "stale_clients",
    "sticky_assign",
    "sticky_shards_of",
]
