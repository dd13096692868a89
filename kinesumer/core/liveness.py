"""Liveness judged by change, on the observer's own clock (the KCL's rule): pure bookkeeping.

No member compares its clock with another's. A member's heartbeat item carries a *token* (its
``last_update`` stamp and a beat counter) that changes at every heartbeat; what the stamp says
does not matter, only that it changed. An observer keeps, for every item it reads, the token it
last saw and the moment (on the observer's own monotonic clock) it first saw that token. An item
is **dead** once its token has not changed for ``timeout`` since then; an item first seen is
given ``timeout`` from first sight, whatever its stamp says (a stamp in the future, or in the
past, changes nothing).

Which moments to pass, for the verdict to come only after the member fenced itself
(``group/heartbeat.py`` has the proof): ``seen_at`` is taken *after* the read that returned
the tokens (every token in the answer was written before that), and ``now`` *before* a read
that still finds the same token (every heartbeat acknowledged before then is in its answer).

Pure: times are passed in (seconds on one monotonic clock), so every rule here is testable
without a clock.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field


@dataclass
class Observer:
    """The last token seen of each key, and when it was first seen (the caller's clock).

    ``timeout``: how long a token may stay unchanged before its key counts as dead.
    """

    timeout: float
    _seen: dict[str, tuple[Hashable, float]] = field(default_factory=dict)

    def observe(self, tokens: Mapping[str, Hashable], seen_at: float, *, complete: bool) -> None:
        """Record the ``tokens`` a read returned (key -> token), read before ``seen_at``. A token
        that differs from the one last seen of its key restarts that key's timer at ``seen_at``.
        ``complete``: the read returned every key there is, so keys missing from it are
        forgotten (deleted items; an item that comes back is first seen again)."""
        for key, token in tokens.items():
            known = self._seen.get(key)
            if known is None or known[0] != token:
                self._seen[key] = (token, seen_at)
        if complete:
            for key in [k for k in self._seen if k not in tokens]:
                del self._seen[key]

    def forget(self, key: str) -> None:
        self._seen.pop(key, None)

    def token(self, key: str) -> Hashable | None:
        """The token last seen of ``key`` (None: never seen, or forgotten)."""
        known = self._seen.get(key)
        return None if known is None else known[0]

    def unchanged_for(self, key: str, now: float) -> float:
        """Seconds the token of ``key`` has stayed the same as of ``now`` (0: never seen)."""
        known = self._seen.get(key)
        return 0.0 if known is None else max(0.0, now - known[1])

    def due(self, key: str) -> float | None:
        """The moment ``key`` falls due to be judged dead if its token does not change (None:
        never seen): a read started then, still finding the same token, judges it dead."""
        known = self._seen.get(key)
        return None if known is None else known[1] + self.timeout

    def is_dead(self, key: str, now: float) -> bool:
        """True when ``key`` was seen and its token has not changed for ``timeout`` by ``now``."""
        known = self._seen.get(key)
        return known is not None and now - known[1] >= self.timeout

    def dead(self, now: float) -> dict[str, Hashable]:
        """Every key judged dead at ``now``, with the token it died with."""
        return {k: tok for k, (tok, first) in self._seen.items() if now - first >= self.timeout}

    def live(self, keys: Iterable[str], now: float) -> list[str]:
        """The ``keys`` that are seen and not dead at ``now``, sorted."""
        return sorted(k for k in set(keys) if k in self._seen and not self.is_dead(k, now))
