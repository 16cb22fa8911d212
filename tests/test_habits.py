"""Habits the linters do not check: every `type: ignore` and `noqa` in src/ names its code and says
why, on its own line, so that a reader (and the next type checker upgrade) can judge it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "loadgen"
# A type-ignore with its [code] then a comment; a noqa with its codes then a reason, in brackets or a comment.
TYPE_IGNORE = re.compile(r"#\s*type:\s*ignore(?P<code>\[[\w\-, ]+\])?(?P<rest>.*)$")
NOQA = re.compile(r"#\s*noqa(?P<code>:\s*[A-Z]+\d+(?:\s*,\s*[A-Z]+\d+)*)?(?P<rest>.*)$")


def _unexplained(line: str) -> str | None:
    """What is missing from a suppression on `line`, or None when it has its code and a reason."""
    for pattern, name in ((TYPE_IGNORE, "type: ignore"), (NOQA, "noqa")):
        m = pattern.search(line)
        if m is None:
            continue
        if not m.group("code"):
            return f"{name} without a code"
        if not re.search(r"\w", m.group("rest")):
            return f"{name} without a reason"
    return None


@pytest.mark.parametrize("line, expected", [
    ("x = f()  # type: ignore", "type: ignore without a code"),
    ("x = f()  # type: ignore[arg-type]", "type: ignore without a reason"),
    ("x = f()  # type: ignore[arg-type]  # typeshed lacks it", None),
    ("import a  # noqa", "noqa without a code"),
    ("import a  # noqa: F401", "noqa without a reason"),
    ("import a  # noqa: F401 (the submodule registers itself)", None),
    ("x = 1  # a plain comment", None),
])
def test_the_rule(line, expected):
    assert _unexplained(line) == expected


def test_every_suppression_in_src_says_why():
    found = [f"{path.relative_to(SRC.parent)}:{n}: {problem}"
             for path in sorted(SRC.rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if (problem := _unexplained(line))]
    assert found == []
