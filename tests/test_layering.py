"""mmtx's layers import downwards only, read from the source with ``ast`` (nothing is imported).

Every import counts, a function's too: an import moved into a function still ties the two modules
together. ``import a.b.c`` is a dependency on the module ``a.b.c`` (not on the packages ``a`` and
``a.b`` that Python runs first), ``from a import b`` one on the submodule ``a.b`` where there is
one, else on ``a``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# layer -> what no file in it may import (each name and everything under it)
APPS = ("mmtx.cli", "mmtx.commands")  # the command-line apps and what they run
FORBIDDEN = {
    "mmtx.models": ("mmtx.data", "mmtx.tasks", *APPS, "hydra", "lightning"),
    "mmtx.nn": ("mmtx.data", "mmtx.tasks", *APPS, "hydra", "lightning"),
    "mmtx.tasks": (*APPS, "hydra"),  # tasks build their models with mmtx.config_build
    "mmtx.export": (*APPS, "hydra"),  # an export loads with torch, safetensors and tokenizers
    "mmtx.commands": ("mmtx.cli",),  # the apps run the commands, never the other way round
}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, root: Path) -> list[tuple[str, tuple[str, ...]]]:
    """Each import statement of a file, anywhere in it, as (absolute module, names taken from it)."""
    name = module_name(path, root)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []  # one level up per extra dot
            module = ".".join(base + ([node.module] if node.module else []))
            found.append((module, tuple(alias.name for alias in node.names if alias.name != "*")))
    return found


def import_graph(root: Path, package: str = "mmtx") -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    files = {module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}

    def longest_module(dotted: str) -> str | None:
        parts = dotted.split(".")
        return next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in files), None)

    graph = {}
    for name, path in files.items():
        deps = set()
        for module, taken in imports(path, root):
            if module.split(".")[0] != package:
                continue
            submodules = {f"{module}.{t}" for t in taken} & files.keys()
            deps |= submodules
            if not taken or len(submodules) < len(taken):  # something taken from the module itself
                deps.add(longest_module(module))
        graph[name] = deps - {name, None}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (an iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if start in state:
            continue
        path, todo = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while todo:
            nxt = next(todo[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                todo.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                todo.append(iter(sorted(graph.get(nxt, ()))))
    return None


def layer_violations(root: Path) -> list[str]:
    """``file: name`` for each import that a layer of `FORBIDDEN` may not make."""
    found = []
    for layer, forbidden in FORBIDDEN.items():
        base = root / Path(*layer.split("."))  # a package, or a module
        module = base.with_suffix(".py")
        for path in sorted(base.rglob("*.py")) if base.is_dir() else [module] if module.is_file() else []:
            statements = imports(path, root)
            names = {m for m, _ in statements} | {f"{m}.{t}" for m, taken in statements for t in taken}
            found += [
                f"{path.relative_to(root).as_posix()}: {n}"
                for n in sorted(names)
                if any(n == f or n.startswith(f + ".") for f in forbidden)
            ]
    return found


def test_layers_import_nothing_above_them():
    assert (ROOT / "mmtx" / "export.py").is_file()  # a module layer is read too
    violations = layer_violations(ROOT)
    assert not violations, "layers import what is above them:\n  " + "\n  ".join(violations)


def test_the_package_has_no_import_cycle():
    graph = import_graph(ROOT)
    assert (
        "mmtx.config_check" in graph["mmtx.commands.train"] and "mmtx.data.splits" in graph["mmtx.config_check"]
    )  # read
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checks_find_what_they_look_for(tmp_path):
    """Imports inside functions, relative imports and ``from package import submodule`` are seen:
    a cycle through them and the forbidden imports are reported, a harmless import is not."""
    pkg = tmp_path / "mmtx"
    for sub in ("", "models", "nn", "data"):
        (pkg / sub).mkdir(exist_ok=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "models" / "head.py").write_text("import torch\n\ndef f():\n    from ..data import base\n")
    (pkg / "data" / "base.py").write_text("from mmtx.models import head\n")
    (pkg / "nn" / "block.py").write_text("import lightning.pytorch as pl\nfrom mmtx.nn import pixels\n")
    (pkg / "nn" / "pixels.py").write_text("MEAN = 0.5\n")
    (pkg / "export.py").write_text("from hydra.utils import instantiate\n")  # a layer that is one module
    graph = import_graph(tmp_path)
    assert graph["mmtx.nn.block"] == {"mmtx.nn.pixels"}  # the submodule, not the package's __init__
    cycle = find_cycle(graph)
    assert cycle is not None and set(cycle) == {"mmtx.models.head", "mmtx.data.base"}, cycle
    assert layer_violations(tmp_path) == [
        "mmtx/models/head.py: mmtx.data",
        "mmtx/models/head.py: mmtx.data.base",
        "mmtx/nn/block.py: lightning.pytorch",
        "mmtx/export.py: hydra.utils",
        "mmtx/export.py: hydra.utils.instantiate",
    ]
    (pkg / "data" / "base.py").write_text("from mmtx.models.head import f\n")
    assert find_cycle(import_graph(tmp_path)) is not None  # a name taken from a module: that module
    (pkg / "models" / "head.py").write_text("import torch\n")
    assert find_cycle(import_graph(tmp_path)) is None
