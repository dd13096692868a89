"""The two faces over one engine: :class:`Kinesumer` (blocking) and :class:`AsyncKinesumer`."""

from .aio import AsyncKinesumer
from .sync import Kinesumer

__all__ = ["AsyncKinesumer", "Kinesumer"]
