"""Reading claimed shards and handing their records over (internal; not a public API).

- ``engine``: the member that reads its shards itself, behind both faces (a
  :class:`~kinesumer.group.member.GroupMember` with fetchers, a buffer and delivery).
- ``fetcher``: GetRecords per shard, paced and resilient; ``efo_fetcher``, ``efo_fallback``,
  ``efo_session``: its twin over SubscribeToShard (enhanced fan-out), polling in place of a
  stalled subscription, and consumer registration.
- ``buffer``: the bounded record buffer; ``delivery``: the cursor's one admission check.
- ``broadcast``, ``broadcast_plan``, ``broadcast_checkpointer``: broadcast mode (every member reads
  every shard, outside any group), reusing the engine's reading and delivery.

The Kinesis calls themselves are :mod:`kinesumer.kinesis`'s.
"""
