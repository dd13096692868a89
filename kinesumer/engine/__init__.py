"""The engine: one asyncio engine behind every face (internal; not a public API)."""

from .engine import Engine

__all__ = ["Engine"]
