"""A real headless browser for the tests: Debian's ``chromium`` (``scripts/setup`` installs it),
driven as a plain command, and the DOM it dumps read back as a small tree.

Why ``--dump-dom`` and not the DevTools protocol: the tests need only the DOM after the page's
script ran, which one command gives (no websocket client, no session to manage), and every call
starts a fresh browser, so nothing of one look leaks into the next. ``--virtual-time-budget``
lets the page run its timers for that many milliseconds of virtual time, which stands still
while a request is in flight, so the page's first fetch of its data always completes before the
dump, however slow the machine. A test waits for a state with :func:`look_until` (bounded
retries of a fresh browser), never on a timer.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest

__all__ = ["Node", "chromium", "dump_dom", "look_until", "parse_dom", "screenshot"]

#: Virtual milliseconds the page runs before the dump: its first fetch and render, and a poll
#: or two after it.
BUDGET_MS = 3_000

#: Real seconds one browser run may take before the test fails (a first start on a slow,
#: loaded machine takes a few seconds).
RUN_TIMEOUT = 90


def chromium() -> str:
    """The browser's path. Where it is missing the test skips, unless
    ``KINESUMER_REQUIRE_BROWSER=1`` (``./scripts/test``, and so CI, which installs it through
    ``scripts/setup``): there a missing browser fails, so the page is never left untested."""
    path = shutil.which("chromium")
    if path is None:
        message = "chromium is not installed (scripts/setup installs it with apt-get)"
        if os.environ.get("KINESUMER_REQUIRE_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


def _run(url: str, budget_ms: int, *action: str) -> subprocess.CompletedProcess[bytes]:
    """A new headless browser with a profile of its own (``--no-sandbox``: the suite may run as
    root) loads ``url``, runs ``budget_ms`` of virtual time, then does ``action``."""
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        done = subprocess.run(
            [
                chromium(),
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--disable-extensions",
                "--hide-scrollbars",
                f"--user-data-dir={profile}",
                f"--virtual-time-budget={budget_ms}",
                *action,
                url,
            ],
            capture_output=True,
            timeout=RUN_TIMEOUT,
            check=False,
        )
    if done.returncode != 0:
        raise AssertionError(
            f"chromium exited {done.returncode} for {url}: {done.stderr.decode()[-2000:]}"
        )
    return done


def dump_dom(url: str, budget_ms: int = BUDGET_MS) -> str:
    """The DOM of ``url`` as serialised after ``budget_ms`` of virtual time."""
    done = _run(url, budget_ms, "--dump-dom")
    if not done.stdout:
        raise AssertionError(f"chromium dumped nothing for {url}: {done.stderr.decode()[-2000:]}")
    return done.stdout.decode()


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def screenshot(
    url: str, path: Path, size: tuple[int, int] = (1200, 800), budget_ms: int = BUDGET_MS
) -> Path:
    """A PNG of ``url`` at ``size`` (width, height) after ``budget_ms`` of virtual time, written
    to ``path`` (replaced); fails unless the browser wrote a PNG there."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    width, height = size
    done = _run(url, budget_ms, f"--screenshot={path}", f"--window-size={width},{height}")
    if not path.is_file() or not path.read_bytes().startswith(PNG_SIGNATURE):
        raise AssertionError(f"chromium wrote no PNG at {path}: {done.stderr.decode()[-2000:]}")
    return path


@dataclass
class Node:
    """An element of the dumped DOM: its tag, attributes and children (text as str)."""

    tag: str
    attrs: dict[str, str]
    children: list[Node | str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text for c in self.children)

    def walk(self) -> Iterator[Node]:
        yield self
        for child in self.children:
            if isinstance(child, Node):
                yield from child.walk()

    def find_all(self, tag: str, **attrs: str) -> list[Node]:
        """Elements of ``tag`` (``*``: any) whose attributes include ``attrs`` (``_`` in a
        keyword stands for ``-``)."""
        wanted = {k.replace("_", "-"): v for k, v in attrs.items()}
        return [
            n
            for n in self.walk()
            if tag in ("*", n.tag) and all(n.attrs.get(k) == v for k, v in wanted.items())
        ]

    def by_id(self, element_id: str) -> Node:
        (found,) = self.find_all("*", id=element_id)
        return found


_VOID = frozenset(
    [
        "area",
        "base",
        "br",
        "col",
        "embed",
        "hr",
        "img",
        "input",
        "link",
        "meta",
        "source",
        "track",
        "wbr",
    ]
)  # elements with no end tag


class _TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in _VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(Node(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for depth in range(len(self.stack) - 1, 0, -1):
            if self.stack[depth].tag == tag:
                del self.stack[depth:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)


def parse_dom(html: str) -> Node:
    """The dumped DOM as a tree (the browser's serialisation is well formed: no guessing)."""
    builder = _TreeBuilder()
    builder.feed(html)
    builder.close()
    return builder.root


def look_until(url: str, predicate: Callable[[Node], bool], timeout: float, what: str) -> Node:
    """Load ``url`` in a fresh browser until ``predicate`` holds on its DOM; the DOM. Fails
    after ``timeout`` seconds naming ``what``, with the last DOM's text."""
    deadline = time.monotonic() + timeout
    while True:
        dom = parse_dom(dump_dom(url))
        if predicate(dom):
            return dom
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout}s; the page said:\n{dom.text[:3000]}")
        time.sleep(0.5)
