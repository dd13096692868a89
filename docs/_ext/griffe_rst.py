"""A griffe extension for the API reference: the docstrings' reStructuredText bits in Markdown.

kinesumer's docstrings are prose with a few reStructuredText habits that mkdocstrings would
print as they are: roles (``:class:`~kinesumer.config.Config```), which become inline code
(the last name with ``~``, as Sphinx shows it), and ``::`` before an indented example, which
Markdown already shows as code once the ``::`` is gone. It also gives the consumers' methods
the docstring ``@shared_doc(NAME)`` attaches at import time (``kinesumer/consumer/base.py``
writes each once for both faces), which reading the source alone does not see. Loaded by
mkdocs.yml (``extensions``); not part of the package.
"""

from __future__ import annotations

import ast
import re
from typing import Any

import griffe

SHARED_DOC = re.compile(r"^shared_doc\((\w+)\)$")
ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|obj|exc):`(~?)([^`]+)`")


def markdown(text: str) -> str:
    """``text`` with reStructuredText roles as inline code and ``::`` markers dropped."""

    def role(match: re.Match[str]) -> str:
        target = match.group(2)
        return f"`{target.rsplit('.', 1)[-1] if match.group(1) else target}`"

    text = ROLE.sub(role, text)
    lines = []
    for line in text.splitlines():
        if line.strip() == "::":
            continue  # a paragraph of its own that only announces the example below
        if line.rstrip().endswith("::"):
            line = line.rstrip()[:-1]  # "for example::" reads "for example:"
        lines.append(line)
    return "\n".join(lines)


def shared_docstring(function: griffe.Function) -> str | None:
    """The text of ``@shared_doc(NAME)`` on ``function``: NAME's string, where its module has it."""
    for decorator in function.decorators:
        match = SHARED_DOC.match(str(decorator.value))
        if match:
            constant = function.module[match.group(1)]
            return str(ast.literal_eval(str(constant.value)))
    return None


def functions(obj: griffe.Object) -> list[griffe.Function]:
    """Every function defined (not imported) under ``obj``."""
    found = []
    for member in obj.members.values():
        if member.is_alias:
            continue
        if isinstance(member, griffe.Function):
            found.append(member)
        elif isinstance(member, (griffe.Class, griffe.Module)):
            found.extend(functions(member))
    return found


class RstToMarkdown(griffe.Extension):
    """Rewrites every docstring as it is loaded; fills in the shared ones once all is loaded."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for function in functions(pkg):
            if function.docstring is None:
                text = shared_docstring(function)
                if text is not None:
                    function.docstring = griffe.Docstring(markdown(text), parent=function)
