"""The package's layout is its architecture: each part of minato imports
only the parts below it, and no module imports itself back (README, "Layout")."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "minato"

# Bottom to top: a part may import the parts before it in this list (and
# itself), never one after it. The extension (_minato) is below all.
LAYERS = [
    "_minato",
    "_util",
    "_io",
    "_thread",
    "_task",
    "_process",
    "_loader",
    "_integrations",
    "dataloader",
    "io",
    "installer",
    "__init__",
]


def _part(module: str) -> str:
    """The layer of a module named `minato.x.y` (or `minato` itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_name(path: pathlib.Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str) -> bool:
    """Whether `name` is a module or package of minato's (the extension
    included, as its stub), not a name defined in one."""
    path = PACKAGE.parent / name.replace(".", "/")
    return path.is_dir() or path.with_suffix(".py").exists() or path.with_suffix(".pyi").exists()


def _imports(path: pathlib.Path) -> set[str]:
    """The minato modules `path` imports, anywhere in it (functions included),
    but for imports only a type checker runs."""
    tree = ast.parse(path.read_text())
    type_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                for sub in ast.walk(inner):
                    type_only.add(id(sub))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "minato")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != "minato":
                continue
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if _is_module(candidate) else node.module)
    return found


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def test_the_layers_name_every_part_of_the_package() -> None:
    parts = {_part(name) for name in MODULES}
    assert parts <= set(LAYERS), f"parts not placed in LAYERS: {parts - set(LAYERS)}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_imports_only_the_parts_below_it(module: str) -> None:
    own = LAYERS.index(_part(module))
    above = sorted(
        imported
        for imported in _imports(MODULES[module])
        if imported != "minato._minato" and LAYERS.index(_part(imported)) > own
    )
    assert not above, f"{module} imports parts above it: {above}"


def test_no_import_cycle() -> None:
    graph = {
        name: {i for i in _imports(path) if i in MODULES and i != name}
        for name, path in MODULES.items()
    }
    state: dict[str, int] = {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = 1
        for imported in sorted(graph[name]):
            if state.get(imported) == 1:
                cycle = trail[trail.index(imported) :] + [imported]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if imported not in state:
                visit(imported, [*trail, imported])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
