"""The docs' Python examples: every block compiles, and the README's quickstart runs as
written against a real server (only its URL is swapped for the test fault server's).

Most blocks in docs/ are fragments that stand for the reader's own code (``base_url=...``,
``messages=[...]``); those must at least be valid Python, top-level ``await`` allowed. The
fault server's own pages are run in full by tests/fault_server/test_docs_examples.py.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import io
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(?P<code>.*?)^```", re.DOTALL | re.MULTILINE)
QUICKSTART_URL = "http://127.0.0.1:8000/v1"


def blocks() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        for n, match in enumerate(BLOCK.finditer(page.read_text(encoding="utf-8")), 1):
            out.append((f"{page.name}#{n}", match["code"]))
    return out


BLOCKS = blocks()


def test_the_docs_have_examples() -> None:
    assert len(BLOCKS) >= 40, len(BLOCKS)


@pytest.mark.parametrize(("name", "code"), BLOCKS, ids=[name for name, _ in BLOCKS])
def test_every_example_compiles(name: str, code: str) -> None:
    compile(code, name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def test_the_readme_quickstart_runs_as_written(fault_server: Any) -> None:
    name, code = BLOCKS[0]
    assert name == "README.md#1" and QUICKSTART_URL in code
    code = code.replace(QUICKSTART_URL, fault_server.url())
    compiled = compile(code, name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    printed = io.StringIO()
    namespace: dict[str, Any] = {}
    with contextlib.redirect_stdout(printed):
        result = eval(compiled, namespace)  # a coroutine: the block awaits at top level
        asyncio.run(asyncio.wait_for(result, timeout=30))
    out = printed.getvalue()
    assert namespace["resp"].choices[0].message.content
    assert str(namespace["resp"].usage.total_tokens) in out
