"""The two faces over one engine: :class:`Kinesumer` (blocking, ``sync.py``) and
:class:`AsyncKinesumer` (``aio.py``), both on :class:`~.base.BaseKinesumer` (``base.py``: what
is not about blocking versus awaiting, written once)."""

from .aio import AsyncKinesumer
from .sync import Kinesumer

__all__ = ["AsyncKinesumer", "Kinesumer"]
