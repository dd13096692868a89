"""How the engine runs (internal; not a public API): ``lifecycle``, its state (one enum);
``supervisor``, its background tasks and the failures surfaced to the caller; ``loop_thread``, an
event loop on a thread of its own for blocking callers; ``aio_timeout``, a bounded await.
"""
