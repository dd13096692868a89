"""Which consumer group a query's member joins: one of its own (the default), or the app's.

By default every streaming query reads the whole stream, as Spark's Kafka source does: two sinks
of one DataFrame, or two queries of one application, each get every record. Each query is then
a consumer group of its own, named after the query's **ledger id**::

    <app>.spark-<query>        (query: the "query" field of every offset in the checkpoint)

The ledger id is minted by ``initialOffset`` (a random uuid) when a query starts with an empty
checkpoint folder, and Spark writes it in every offset it persists under
``<checkpointLocation>/offsets/``: a restart from the same checkpoint folder resumes the same
group (its claims, pins and checkpoints), while a new checkpoint folder is a new reader that
starts at ``initial_position`` (``LATEST`` by default: what arrives from its start on), exactly
like Kafka's ``startingOffsets`` for a new checkpoint. Nothing else identifies the query (the
source sees neither Spark's query id nor the checkpoint path), and nothing else needs to.

With ``shared_group=true`` the member joins ``<app>`` itself, as before: the app's queries and
its plain :class:`~kinesumer.Kinesumer` processes split the shards between them (each record
read by one of them), and a ``LATEST`` shard resumes where any of them first opened it.

The ledger (:mod:`.ledger`) stays keyed by ``<app>`` and the ledger id in both cases: an
executor's read needs nothing from the group.

State a per-query group leaves in the table once its checkpoint folder is gone for good: its
client item (deleted at a graceful leave, else expired by TTL), its ledger items (TTL
``ledger_ttl_seconds``), and, without TTL, one checkpoint item and at most one ``LATEST`` pin
per shard read (about 200 bytes each) plus a few small items of the group's leader.
:func:`~.cleanup.forget_query` deletes them all; the source logs the group's name at INFO when
the query starts.


Spark's offsets carry the group (``"group"``), and the checkpoint's group wins over the option:
a restart from a checkpoint folder stays in the group it began in even if ``shared_group`` was
changed (the INFO line logged when the query starts names the group). A checkpoint folder
written before groups per query (offsets of batch 1 and later without ``"group"``) keeps
reading in the app's group, as it did: its claims, checkpoints and pins are there.
"""

from __future__ import annotations

from dataclasses import replace

from ....config import Config
from ..offsets import SourceOffset

#: Between the app and the ledger id in a per-query group's name.
PER_QUERY_SEPARATOR = ".spark-"


def group_of(app: str, query: str, shared: bool) -> str:
    """The group (the ``app`` of the member's Config) for ledger id ``query``."""
    return app if shared else f"{app}{PER_QUERY_SEPARATOR}{query}"


def group_of_offset(app: str, offset: SourceOffset, shared: bool) -> str:
    """The group of ``offset``'s query: the one it carries; ``shared``: the option, which
    decides only for initialOffset's batch 0 (Spark never persists it); a later offset without
    a group is from a checkpoint written before groups per query: the app's, as then."""
    if offset.group is None:
        return group_of(app, offset.query, shared) if offset.batch == 0 else app
    return offset.group


def group_config(config: Config, offset: SourceOffset, shared: bool) -> Config:
    """``config`` for the member of ``offset``'s query: its ``app`` is the group's name."""
    group = group_of_offset(config.app, offset, shared)
    return config if group == config.app else replace(config, app=group)
