"""The source's executor side (internal): ``read`` (one shard of one batch, as Arrow, its range
fixed by the ledger), ``shard_read`` (a new read, a replay, or a batch read ahead), and
``readahead`` / ``readahead_format`` (the next batches of a shard read while Spark plans).
"""
