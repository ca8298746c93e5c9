"""The layers of docs/architecture.md only look down: no import of the package (at any depth,
under ``TYPE_CHECKING`` too, read with ``ast``) runs to a higher layer, nor in a circle."""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).parents[1]
LAYERS = {
    "errors and units": "errors units files floor _internal",
    "the core": "attn testing",
    "config": "schema resolver compose",
    "calibration's terms": "calibration.profile calibration.record conf",
    "calibration's measuring": "calibration",
    "the engine integrations": "integrations",
    "the apps": "__init__ apps",
}
"""Bottom to top. A module is in the layer of its name, else of its folder's (a new module of
``calibration/`` is measuring until listed); ``__init__`` is the package's: the facade. The
engines' plugins sit below the apps: what an engine loads imports no app."""
LAYER_OF = {name: i for i, names in enumerate(LAYERS.values()) for name in names.split()}
PATHS = {".".join(p.relative_to(ROOT / "mstar_resources").with_suffix("").parts)
         .removesuffix(".__init__"): p for p in ROOT.glob("mstar_resources/**/*.py")}  # fmt: skip
PATHS["conf"] = ROOT / "conf" / "__init__.py"  # it ships as mstar_resources.conf
FULL = {f"mstar_resources.{module}".removesuffix(".__init__"): module for module in PATHS}


def layer(module: str) -> int:
    while module not in LAYER_OF and "." in module:
        module = module.rpartition(".")[0]
    return LAYER_OF.get(module, -1)


def _imports(full: str) -> set[str]:
    """What ``full`` imports (``from package import module``: the module)."""
    path, found = PATHS[FULL[full]], set()
    package = full.split(".") if path.stem == "__init__" else full.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) + 1 - node.level], base]).strip(".")
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in FULL else base
                      for a in node.names}  # fmt: skip
    return found


IMPORTS = {module: _imports(full) for full, module in FULL.items()}
GRAPH = {module: {FULL[t] for t in ts if t in FULL} - {module} for module, ts in IMPORTS.items()}


def upward(graph: Mapping[str, set[str]]) -> list[str]:
    return [f"{module} imports {target} ({list(LAYERS)[layer(target)]})"
            for module in sorted(graph) for target in sorted(graph[module])
            if layer(target) > layer(module)]  # fmt: skip


def circles(graph: Mapping[str, set[str]]) -> list[str]:
    """The nodes of ``graph`` that reach themselves (each round doubles the paths followed)."""
    reach = {node: set(targets) for node, targets in graph.items()}
    for _ in range(len(graph).bit_length()):
        reach = {node: found.union(*(reach.get(t, ()) for t in found))
                 for node, found in reach.items()}  # fmt: skip
    return sorted(node for node, found in reach.items() if node in found)


def rooms(graph: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """``graph`` by room: a folder (``attn``, ``apps``...) or a top-level module."""
    folded: dict[str, set[str]] = {}
    for module, targets in graph.items():
        folded.setdefault(module.split(".")[0], set()).update(t.split(".")[0] for t in targets)
    return {room: targets - {room} for room, targets in folded.items()}


def test_every_module_has_a_layer_and_every_name_in_the_table_is_a_module():
    assert [module for module in GRAPH if layer(module) < 0] == []
    assert [name for name in LAYER_OF if name not in GRAPH] == []


def test_no_import_runs_upward_nor_in_a_circle_of_modules_or_rooms():
    # the walk sees an import in a method, and one under TYPE_CHECKING
    assert "calibration.record" in GRAPH["integrations.plugin"] and "resolver" in GRAPH["__init__"]
    assert (upward(GRAPH), circles(GRAPH), circles(rooms(GRAPH))) == ([], [], [])


def test_the_checks_find_an_upward_import_and_circles():
    graph = {"errors": {"apps.dry_run"}, "apps.dry_run": set(),  # upward
             "integrations.setting": {"apps.settings"}, "apps.settings": set(),  # a plugin: too
             "attn.pool": {"attn.buffer", "_internal.floor"}, "attn.buffer": {"attn.pool"},
             "_internal.floor": set(), "_internal.output": {"attn.buffer"}}  # fmt: skip
    assert upward(graph) == ["_internal.output imports attn.buffer (the core)",
                             "errors imports apps.dry_run (the apps)",
                             "integrations.setting imports apps.settings (the apps)"]  # fmt: skip
    assert circles(graph) == ["attn.buffer", "attn.pool"]
    assert circles(rooms(graph)) == ["_internal", "attn"]  # no module circle, a room circle


def test_no_module_imports_hydra_s_private_api():
    """``hydra._internal`` may change in any release; the apps use Hydra's public API only."""
    assert sorted((m, t) for m, ts in IMPORTS.items() for t in ts if t.startswith("hydra._")) == []


def test_every_app_is_in_the_apps_folder():
    """An app: a console script, or a module that runs Hydra's command line or runs as a script."""
    scripts = (ROOT / "pyproject.toml").read_text().split("[project.scripts]")[1].split("\n[")[0]
    apps = {FULL[m] for m in re.findall(r'"(mstar_resources\.[\w.]+):', scripts)} | {
        module for module, path in PATHS.items() for node in ast.walk(ast.parse(path.read_text()))
        if (isinstance(node, ast.Call) and ast.unparse(node.func) in ("hydra_app", "hydra.main"))
        or (isinstance(node, ast.Compare) and ast.unparse(node) == "__name__ == '__main__'")
    }  # fmt: skip
    assert {"apps.dry_run", "apps.calibrate"} <= apps
    assert [app for app in sorted(apps) if not app.startswith("apps.")] == []
