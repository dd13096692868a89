"""``df.write.format("kinesumer")`` and ``df.writeStream.format("kinesumer")``: the sink."""

from .writer import SinkOptions, parse_sink_options, sink_writer

__all__ = ["SinkOptions", "parse_sink_options", "sink_writer"]
