"""The package's layers only look down: an ``ast`` walk of every module's imports (at any depth,
under ``TYPE_CHECKING`` too) finds no import of a higher layer and no circle."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "mstar_resources"
CONF = Path(__file__).parents[1] / "conf"

LAYERS = [
    ("errors and units", ["errors", "units", "files", "_internal", "_internal.limits",
                          "_internal.floor", "_internal.devices", "_internal.table"]),
    ("the core", ["attn", "attn.workspace", "attn.buffer", "attn.float_workspace",
                  "attn.int_workspace", "attn.pool",
                  "attn._overflow", "attn._agree", "attn._flashinfer", "testing"]),
    ("config", ["schema", "resolver"]),
    ("calibration's terms", ["calibration", "calibration.engine_plans",
                             "calibration.engine_buffers", "calibration.profile",
                             "calibration.record", "calibration.versions", "conf"]),
    ("calibration's measuring", ["calibration.bounds", "calibration.shapes",
                                 "calibration.measure", "calibration.checks",
                                 "calibration.calibrate", "calibration.report",
                                 "calibration.deployments",
                                 "calibration.override"]),
    ("the replay", ["replay", "replay.trace", "replay.trace_rows", "replay.trace_file",
                    "replay.scheduler", "replay.workload", "replay.roles", "replay.model",
                    "replay.attention", "replay.buffers",
                    "replay.graphs", "replay.engine", "replay.report"]),
    ("the apps", ["", "apps", "apps.hydra_app", "apps.hydra_errors", "apps.settings",
                  "apps.dry_run", "apps.stdout", "apps.calibrate_settings", "apps.calibrate",
                  "apps.replay_settings", "apps.replay"]),
    ("the engine integrations", ["integrations", "integrations._post_import",
                                 "integrations.setting", "integrations.vllm",
                                 "integrations.vllm.plans", "integrations.vllm.setting",
                                 "integrations.vllm.workspaces", "integrations.vllm.seams",
                                 "integrations.seam", "integrations.sglang",
                                 "integrations.sglang.setting", "integrations.sglang.workspaces",
                                 "integrations.sglang.seams"]),
]  # fmt: skip
"""Bottom to top; a module may import its own layer's and those below. "" is the package's
``__init__``, the facade that names the public API. Calibration's terms (the profile, the record,
the engines' plans and buffers) are torch-free: the dry run reads them."""

APPS = dict(LAYERS)["the apps"]
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


def test_no_module_imports_hydra_s_private_api():
    """``hydra._internal`` may change in any release; the apps use Hydra's public API only."""
    private = [
        f"{path.relative_to(PACKAGE.parent)}: {name}"
        for path in [*PACKAGE.rglob("*.py"), CONF / "__init__.py"]
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for name in ([node.module or ""] if isinstance(node, ast.ImportFrom) else
                     [alias.name for alias in node.names])
        if name.startswith("hydra._internal")
    ]  # fmt: skip
    assert private == []


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


def circles(graph: Mapping[str, set[str]]) -> list[str]:
    """Every circle of imports in ``graph`` (each node's targets), as ``a -> b -> a``."""
    found = []

    def visit(node: str, trail: list[str]) -> None:
        if node in trail:
            found.append(" -> ".join([*trail[trail.index(node) :], node]))
            return
        for target in sorted(graph[node]):
            visit(target, [*trail, node])

    for node in graph:
        visit(node, [])
    return sorted(set(found))


def test_no_import_runs_in_a_circle():
    assert circles(GRAPH) == []


def test_the_walk_sees_imports_inside_functions_and_under_type_checking():
    assert "attn._agree" in GRAPH["attn.pool"]  # imported inside a method
    assert "resolver" in GRAPH[""]  # under TYPE_CHECKING in the facade


@pytest.mark.parametrize(
    ("code", "forbidden"),
    [
        pytest.param(
            "import mstar_resources.conf", ("mstar_resources.apps",), id="conf"
        ),
        pytest.param(
            "from mstar_resources import resolve, build_pools",
            ("mstar_resources.replay", "mstar_resources.apps",
             "mstar_resources.calibration", "mstar_resources.integrations"),
            id="resolver",
        ),
        pytest.param(
            "import mstar_resources.integrations.vllm",
            ("vllm", "mstar_resources.calibration", "mstar_resources.replay",
             "mstar_resources.apps", "torch"),
            id="vllm-plugin",
        ),
    ],
)  # fmt: skip
def test_what_an_engine_imports_loads_nothing_above_it(code, forbidden):
    probe = f"{code}; import sys; print(sorted(sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    loaded = eval(done.stdout)  # a list of module names
    assert [m for m in loaded if m.startswith(forbidden)] == []


CORE = {"mstar_resources", "mstar_resources.errors", "mstar_resources.units",
        "mstar_resources._internal", "mstar_resources._internal.floor",
        "mstar_resources._internal.limits", "mstar_resources.attn",
        "mstar_resources.attn.workspace", "mstar_resources.attn.buffer",
        "mstar_resources.attn.float_workspace",
        "mstar_resources.attn.int_workspace", "mstar_resources.attn.pool",
        "mstar_resources.attn._overflow", "mstar_resources.attn._flashinfer"}  # fmt: skip
"""The modules an engine adopts for its workspaces."""


@pytest.mark.parametrize(
    ("code", "allowed"),
    [
        pytest.param("import mstar_resources.attn.workspace", CORE, id="workspace"),
        pytest.param(
            "from mstar_resources.resolver import resolve, build_pools\n"
            "pools = build_pools(resolve({'attn': {'decode': {'labels': ['decode']}}}), 'cpu')\n"
            "pools['attn.decode'].get('decode').tensor",
            CORE | {"mstar_resources.resolver", "mstar_resources.schema"},
            id="resolve",
        ),
    ],
)  # fmt: skip
def test_the_core_loads_only_the_core(code, allowed):
    """What the core loads beyond torch and OmegaConf (which it is built on): its own modules,
    no Hydra, no tqdm beyond what torch loads itself, nothing of the apps, calibration or the
    replay."""
    probe = (
        "import sys, torch, omegaconf\n"
        "before = set(sys.modules)\n"
        f"{code}\n"
        "print(sorted(set(sys.modules) - before))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    loaded = eval(done.stdout)  # a list of module names
    ours = {m for m in loaded if m.split(".")[0] == "mstar_resources"}
    assert sorted(ours - allowed) == []
    assert [m for m in loaded if m.split(".")[0] in ("hydra", "tqdm")] == []
    assert "mstar_resources.attn.workspace" in ours


def _room(module: str) -> str:
    """The room of the house a module is in: its folder, or the module itself at the top."""
    return module.split(".")[0] if "." in module or module in FOLDERS else module


FOLDERS = {"apps", "attn", "calibration", "replay", "_internal", "integrations"}
ROOMS: dict[str, set[str]] = {}
for _module, _targets in GRAPH.items():
    ROOMS.setdefault(_room(_module), set()).update(
        _room(target) for target in _targets if _room(target) != _room(_module)
    )
FLOORS = {room: [LAYER_OF[module] for module in GRAPH if _room(module) == room] for room in ROOMS}


def test_no_room_imports_a_room_wholly_above_it():
    """A folder may span floors; an import from it may not reach a room whose every module is
    above all of the folder's."""
    upward = [
        f"{room} imports {target}"
        for room, targets in ROOMS.items()
        for target in sorted(targets)
        if min(FLOORS[target]) > max(FLOORS[room])
    ]
    assert upward == []


def test_no_rooms_import_each_other_in_a_circle():
    """Folders and top-level modules: no circle, so no folder's lower modules import anything
    that imports the folder's app back."""
    assert circles(ROOMS) == []


def test_every_app_is_in_the_apps_folder():
    """The apps' layer is the facade and ``apps/``: no folder below holds an app of its own."""
    assert [module for module in APPS if module and _room(module) != "apps"] == []
