"""src/stallproof is laid out as its map says (the package docstring): every module is on the
map, each sub-package maps its own modules, and imports go only downwards through the layers,
so no import circle exists, not even one that only type checking follows."""

from __future__ import annotations

import ast
import importlib
import pathlib
import re

import stallproof

SRC = pathlib.Path(stallproof.__file__).parent
# The map's layers, lowest first: a module may import from its own layer or one below.
LAYERS = ["foundations", "the wire", "policies", "the engine", "faces", "the command"]


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in SRC.rglob("*.py")}


def _map_rows(doc: str) -> dict[str, str]:
    """module (as the map writes it, `_x` or `_x/`) -> the layer heading above it."""
    rows: dict[str, str] = {}
    layer = ""
    for line in doc.splitlines():
        heading = re.match(r"\*\*(.+?)\*\*", line)
        if heading:
            layer = heading.group(1)
            continue
        row = re.match(r"`(\w+/?)`\s", line)
        if row:
            rows[row.group(1)] = layer
    return rows


TOP_MAP = _map_rows(stallproof.__doc__ or "")


def _layer_of(module: str) -> int:
    top = module.split(".")[1]
    key = top + "/" if f"stallproof.{top}" in MODULES and (SRC / top).is_dir() else top
    return LAYERS.index(TOP_MAP[key])


def _imports(module: str) -> set[str]:
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):  # every import: typing-only and lazy too
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
            if node.module is None:  # from . import _x: the modules named, not their package
                found.update(
                    f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES
                )
            elif target in MODULES:
                found.add(target)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("stallproof."):
            found.add(node.module or "")
    return found - {module}


def test_every_module_is_on_the_map() -> None:
    top_level = {m.split(".")[1] for m in MODULES if m != "stallproof"}
    on_map = {name.rstrip("/") for name in TOP_MAP}
    assert top_level - on_map == set(), "modules missing from stallproof's map"
    assert on_map - top_level == set(), "the map names modules that do not exist"


def test_each_subpackage_maps_its_modules() -> None:
    for package in sorted(m for m in MODULES if MODULES[m].name == "__init__.py"):
        if package == "stallproof":
            continue
        doc = importlib.import_module(package).__doc__ or ""
        mapped = set(_map_rows(doc))
        modules = {m.rsplit(".", 1)[1] for m in MODULES if m.rsplit(".", 1)[0] == package}
        assert modules == mapped, package


def test_imports_go_only_downwards() -> None:
    upward = []
    for module in MODULES:
        if module == "stallproof":
            continue  # the package re-exports every layer
        for target in _imports(module):
            if target != "stallproof" and _layer_of(target) > _layer_of(module):
                upward.append(f"{module} -> {target}")
    assert upward == [], upward


def test_no_import_circle() -> None:
    graph = {m: _imports(m) for m in MODULES}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        if module in path:
            raise AssertionError(" -> ".join((*path[path.index(module) :], module)))
        if module in done:
            return
        for target in graph[module]:
            if target != "stallproof":
                visit(target, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())
