"""The source's driver side (internal): a group member that plans micro-batches and never reads
records. ``planner`` (the offsets Spark asks for), ``settle`` (checkpoints once Spark committed
a batch), ``rotation`` (which shards a bounded batch reads), ``pins`` (where ``LATEST`` first
opened each shard), ``groups`` and ``cleanup`` (a query's own consumer group, and removing it),
``driverio`` (the driver's own AWS calls), ``progress`` (what each batch read, as Spark shows it).
"""
