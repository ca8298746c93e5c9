"""The names the engine plugins rely on, read in the engines' wheels without importing them.

    pip download --no-deps vllm==0.26.0 vllm==0.33.0 sglang==0.5.17 sglang==0.5.23 -d wheels
    python scripts/engine_seams.py wheels/vllm-0.26.0-*.whl wheels/vllm-0.33.0-*.whl \
        > tests/integrations/data/vllm_seams.json
    python scripts/engine_seams.py wheels/sglang-0.5.17-*.whl wheels/sglang-0.5.23-*.whl \
        > tests/integrations/data/sglang_seams.json

For each wheel: its engine's version, its sha256, and for each module that holds a seam of that
engine's plugin (``mstar_resources.integrations.vllm.SEAMS``, ``...sglang.SEAMS``) the names it
defines or imports at its top level (under a top-level ``if`` too), with each class's methods
(``Class.method``) and the attributes its ``__init__`` sets on ``self`` (``Class.attribute``),
as an ``ast`` walk of its source finds them. The CPU tests check every seam against these files,
and against the wheels themselves where ``MSTAR_VLLM_WHEELS`` or ``MSTAR_SGLANG_WHEELS`` names a
folder holding them.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mstar_resources.integrations import sglang, vllm

ENGINES = {"vllm": vllm.SEAMS, "sglang": sglang.SEAMS}
"""Each engine's seams, by the name its wheels start with."""


def defined_names(source: str) -> list[str]:
    """A module's top-level names: functions, classes, ``Class.method``s, assigned names."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            methods = [
                item
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            ]
            names.update(f"{node.name}.{method.name}" for method in methods)
            init = next((m for m in methods if m.name == "__init__"), None)
            names.update(f"{node.name}.{name}" for name in _set_on_self(init))
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.If):  # vllm.envs declares its variables under TYPE_CHECKING
            for inner in node.body:
                if isinstance(inner, ast.AnnAssign) and isinstance(inner.target, ast.Name):
                    names.add(inner.target.id)
                elif isinstance(inner, ast.ImportFrom):  # SGLang imports FlashInfer's under an if
                    names.update(alias.asname or alias.name for alias in inner.names)
        elif isinstance(node, ast.ImportFrom):
            names.update(alias.asname or alias.name for alias in node.names)
    return sorted(names)


def _set_on_self(method: ast.FunctionDef | ast.AsyncFunctionDef | None) -> set[str]:
    """The attributes ``method`` (a class's ``__init__``) sets on ``self``."""
    if method is None:
        return set()
    found = set()
    for node in ast.walk(method):
        targets = (
            node.targets if isinstance(node, ast.Assign)
            else [node.target] if isinstance(node, ast.AnnAssign) else []
        )  # fmt: skip
        flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
        for target in flat:
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            ):
                found.add(target.attr)
    return found


def module_path(module: str, wheel: zipfile.ZipFile) -> str:
    plain = module.replace(".", "/") + ".py"
    package = module.replace(".", "/") + "/__init__.py"
    listed = set(wheel.namelist())
    return plain if plain in listed else package


def read_wheel(path: Path) -> dict[str, object]:
    match = re.match(rf"({'|'.join(ENGINES)})-([^-]+)-", path.name)
    if match is None:
        raise SystemExit(
            f"{path}: not a wheel of {' or '.join(ENGINES)} (<engine>-<version>-...whl)"
        )
    seams = ENGINES[match.group(1)]
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    modules: dict[str, list[str]] = {}
    with zipfile.ZipFile(path) as wheel:
        for module in sorted({seam.module for seam in seams}):
            name = module_path(module, wheel)
            source = wheel.read(name).decode() if name in wheel.namelist() else ""
            modules[module] = defined_names(source)
    return {"version": match.group(2), "wheel": path.name, "sha256": digest, "modules": modules}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheels", nargs="+", type=Path, help="the wheels of one engine")
    args = parser.parse_args()
    print(json.dumps([read_wheel(path) for path in args.wheels], indent=1))


if __name__ == "__main__":
    main()
