"""The package's layers only look down: an ``ast`` walk of every module's imports (at any depth,
under ``TYPE_CHECKING`` too) finds no import of a higher layer and no circle."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "mstar_resources"
CONF = Path(__file__).parents[1] / "conf"

LAYERS = [
    ("errors and units", ["errors", "units", "files", "_limits", "_floor", "_table", "_devices"]),
    ("the core", ["attn", "attn.workspace", "attn._overflow", "attn._agree"]),
    ("config", ["schema", "engine_presets", "profile", "calibrated", "resolver", "conf"]),
    ("calibration", ["calibration", "calibration.bounds", "calibration.shapes",
                     "calibration.measure", "calibration.calibrate", "calibration.override",
                     "calibration.engines", "calibration.versions"]),
    ("the replay", ["replay", "replay.trace", "replay.scheduler", "replay.workload",
                    "replay.roles", "replay.model", "replay.engine", "replay.report"]),
    ("the apps", ["", "app", "_explain", "settings", "cli", "calibration.cli", "replay.cli"]),
]  # fmt: skip
"""Bottom to top; a module may import its own layer's and those below. "" is the package's
``__init__``, the facade that names the public API."""

LAYER_OF = {module: index for index, (_, modules) in enumerate(LAYERS) for module in modules}


def _module_name(path: Path) -> str:
    if path.is_relative_to(CONF):
        return "conf"
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(dotted: str) -> bool:
    relative = dotted.removeprefix("mstar_resources").removeprefix(".").replace(".", "/")
    return (PACKAGE / f"{relative}.py").exists() or (PACKAGE / relative / "__init__.py").exists()


def _imports(path: Path) -> set[str]:
    """The package's modules ``path`` imports, by name relative to the package."""
    name = _module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                if path.is_relative_to(CONF):
                    base = ["conf"]
                module = ".".join([*base, *(node.module or "").split(".")]).strip(".")
                prefix = "mstar_resources." + module if module else "mstar_resources"
            else:
                prefix = node.module or ""
            # ``from package import module`` imports the module; ``from module import name``, the
            # module.
            targets = [
                f"{prefix}.{alias.name}" if _is_module(f"{prefix}.{alias.name}") else prefix
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            if target == "mstar_resources" or target.startswith("mstar_resources."):
                found.add(target.removeprefix("mstar_resources").removeprefix("."))
    return {module for module in found if module in LAYER_OF} - {name}


GRAPH = {
    _module_name(path): _imports(path) for path in [*PACKAGE.rglob("*.py"), CONF / "__init__.py"]
}


def test_every_module_has_a_layer():
    assert sorted(set(GRAPH) - set(LAYER_OF)) == []
    assert sorted(set(LAYER_OF) - set(GRAPH)) == []


def test_no_import_runs_upward():
    upward = [
        f"{module} ({LAYERS[LAYER_OF[module]][0]}) imports {target} ({LAYERS[LAYER_OF[target]][0]})"
        for module, targets in GRAPH.items()
        for target in sorted(targets)
        if LAYER_OF[target] > LAYER_OF[module]
    ]
    assert upward == []


def test_no_import_runs_in_a_circle():
    circles = []

    def visit(module: str, trail: list[str]) -> None:
        if module in trail:
            circles.append(" -> ".join([*trail[trail.index(module) :], module]))
            return
        for target in sorted(GRAPH[module]):
            visit(target, [*trail, module])

    for module in GRAPH:
        visit(module, [])
    assert sorted(set(circles)) == []


def test_the_walk_sees_imports_inside_functions_and_under_type_checking():
    assert "attn._agree" in GRAPH["attn.workspace"]  # imported inside seal()
    assert "resolver" in GRAPH[""]  # under TYPE_CHECKING in the facade


@pytest.mark.parametrize(
    ("code", "forbidden"),
    [
        pytest.param(
            "import mstar_resources.conf", ("mstar_resources.settings",), id="conf"
        ),
        pytest.param(
            "from mstar_resources import resolve, build_pools",
            ("mstar_resources.replay", "mstar_resources.app", "mstar_resources.settings",
             "mstar_resources.calibration"),
            id="resolver",
        ),
    ],
)  # fmt: skip
def test_what_an_engine_imports_loads_nothing_above_it(code, forbidden):
    probe = f"{code}; import sys; print(sorted(m for m in sys.modules if m.startswith('mstar')))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    loaded = eval(done.stdout)  # a list of module names
    assert [m for m in loaded if m.startswith(forbidden)] == []
