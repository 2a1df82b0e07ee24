"""The fault server's docs: every Python example runs as written, in a fresh project.

Each ```python block of docs/fault_*.md is one of:

- a **test module** (it defines ``test_...``): copied into an empty directory, one file per
  block, and run there by pytest in a subprocess, with the plugin's real server; every test
  must pass. Such a file may import only the standard library and what installing
  stallproof brings (httpx, anyio, pytest's plugins), never openai or trio;
- a **fragment**, marked by an ``<!-- fragment: why -->`` line just above it (it uses
  ``srv`` from the text around it, or stands for the reader's own code): it must compile.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("fault_*.md"))
BLOCK = re.compile(r"(?P<before>[^\n]*)\n```python\n(?P<code>.*?)```", re.DOTALL)
# What `pip install stallproof pytest-asyncio` brings, besides the standard library.
INSTALLED = {"stallproof", "fault_server", "pytest", "pytest_asyncio", "httpx", "anyio"}


SCRIPT = "<!-- fragment: a script"  # a fragment that stands alone: it must run as is.


def examples() -> list[tuple[str, str, bool]]:
    """(name, code, is_fragment) for every python block of the fault server's docs."""
    out = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for n, match in enumerate(BLOCK.finditer(text), 1):
            fragment = match["before"].startswith("<!-- fragment")
            out.append((f"{doc.stem}_{n}", match["code"], fragment))
    return out


EXAMPLES = examples()
RUNNABLE = [(name, code) for name, code, fragment in EXAMPLES if not fragment]


def imported(code: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.partition(".")[0])
    return names


def test_the_docs_have_examples_of_both_kinds() -> None:
    assert len(RUNNABLE) >= 6, [name for name, _ in RUNNABLE]
    assert any(fragment for _, _, fragment in EXAMPLES)


@pytest.mark.parametrize(("name", "code"), [(n, c) for n, c, f in EXAMPLES if f])
def test_fragments_compile(name: str, code: str) -> None:
    compile(code, name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


@pytest.mark.parametrize(("name", "code"), RUNNABLE)
def test_runnable_examples_are_tests_that_import_only_what_stallproof_installs(
    name: str, code: str
) -> None:
    assert re.search(r"^(async )?def test_", code, re.MULTILINE), (
        f"{name}: not a test module; mark it <!-- fragment: why --> if it cannot run alone"
    )
    foreign = imported(code) - INSTALLED - set(sys.stdlib_module_names)
    assert not foreign, f"{name} imports {sorted(foreign)}, which a fresh project lacks"


def scripts() -> list[tuple[str, str]]:
    """(name, code) of the fragments marked as scripts: complete programs, imports and all."""
    out = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for n, match in enumerate(BLOCK.finditer(text), 1):
            if match["before"].startswith(SCRIPT):
                out.append((f"{doc.stem}_{n}", match["code"]))
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("name", "code"), scripts())
def test_script_fragments_run_as_written(name: str, code: str, tmp_path: Path) -> None:
    """The TLS example once used ``running`` without importing it: scripts are run."""
    script = tmp_path / f"{name}.py"
    script.write_text(code, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]


def documented_config() -> str:
    """The ``toml`` block of docs/fault_pytest.md: the configuration a reader copies."""
    text = (ROOT / "docs" / "fault_pytest.md").read_text(encoding="utf-8")
    found = re.search(r"```toml\n(?P<config>.*?)```", text, re.DOTALL)
    assert found, "docs/fault_pytest.md shows no pytest configuration"
    return found["config"]


@pytest.mark.slow
def test_runnable_examples_pass_in_a_fresh_project(tmp_path: Path) -> None:
    for name, code in RUNNABLE:
        (tmp_path / f"test_{name}.py").write_text(code, encoding="utf-8")
    # The configuration docs/fault_pytest.md gives, and warnings as errors: an unset
    # pytest-asyncio loop scope was an INTERNALERROR there.
    (tmp_path / "pyproject.toml").write_text(documented_config(), encoding="utf-8")
    command = [sys.executable, "-m", "pytest", "-q", "-W", "error", "-p", "no:cacheprovider"]
    result = subprocess.run(
        [*command, str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " failed" not in result.stdout and " error" not in result.stdout, result.stdout
