"""What ``kinesumer checkpoints set|reset`` prints while it watches an owner: owner ids come from
the state table (anyone with write access to it wrote them), so they reach the terminal escaped,
as ``status`` shows them."""

from __future__ import annotations

import asyncio

import pytest

from kinesumer.cli import liveness
from kinesumer.models import ClientInfo

HOSTILE = "member-\x1b[2J\x1b]0;pwned\x07-\u202eevil"


class SilentOwnerStore:
    """A table holding one client item that never heartbeats, and no leader's view."""

    async def read_view_head(self, consistent: bool = False) -> None:
        return None

    async def list_clients(self) -> list[ClientInfo]:
        return [ClientInfo(client_id=HOSTILE, last_update_ms=1, beat=1)]


def test_watching_an_owner_prints_its_id_escaped(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(liveness, "SAY_AFTER", 0.0)
    store = SilentOwnerStore()
    live = asyncio.run(liveness.live_owners(store, [HOSTILE], 0.5))  # type: ignore[arg-type]
    assert live == {}  # no heartbeat for the timeout: not live
    err = capsys.readouterr().err
    assert "watching member-\\x1b[2J\\x1b]0;pwned\\x07-\\u202eevil for a heartbeat" in err
    assert "\x1b" not in err and "\u202e" not in err and "\x07" not in err
