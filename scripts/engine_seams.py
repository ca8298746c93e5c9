"""The names the engine plugins rely on, read in the engines' wheels without importing them.

    for v in 0.26.0 0.27.1 0.28.0 0.29.0 0.30.0 0.31.0 0.32.0 0.33.0 0.34.0; do
        pip download -q --no-deps vllm==$v -d wheels; done
    for v in 17 18 19 20 21 22 23; do pip download -q --no-deps sglang==0.5.$v -d wheels; done
    python scripts/engine_seams.py $(ls wheels/vllm-*.whl | sort -V) \
        > tests/integrations/data/vllm_seams.json
    python scripts/engine_seams.py $(ls wheels/sglang-*.whl | sort -V) \
        > tests/integrations/data/sglang_seams.json

For each wheel: its engine's version, its sha256, and for each module that holds a seam of that
engine's plugin (``mstar_resources.integrations.vllm.SEAMS``, ``...sglang.SEAMS``) the seams it
has among the names it defines or imports at its top level (under a top-level ``if`` too), with
each class's methods (``Class.method``) and the attributes its ``__init__`` sets on ``self``
(``Class.attribute``), as an ``ast`` walk of its source finds them; and for each seam that is a
function or a method (and each class whose ``__init__`` the plugin reads decisions from), a
digest of its body
(``ast.unparse`` of it, docstring dropped), so that a change between releases is seen even where
the name stays. The CPU tests check every seam against these files, and against the wheels
themselves where ``MSTAR_VLLM_WHEELS`` or ``MSTAR_SGLANG_WHEELS`` names a folder holding them.

``--diff SEAM`` prints, for one seam, the body of each release where it changed.
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

import itertools

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


def body_of(tree: ast.Module, name: str) -> str | None:
    """The normalised source of function, method or ``Class.__init__`` ``name`` in ``tree``
    (None where there is none): ``ast.unparse``, its docstring dropped."""
    body: list[ast.stmt] = tree.body
    node: ast.stmt | None = None
    for part in name.split("."):
        node = next((n for n in body if isinstance(n, DEFINITIONS) and n.name == part), None)
        if node is None:
            return None
        body = node.body
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    node = ast.parse(ast.unparse(node)).body[0]
    assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        node.body = node.body[1:] or [ast.Pass()]
    return ast.unparse(node)


DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def bodied(seams: tuple[vllm.Seam, ...]) -> list[str]:
    """The seams' names whose bodies are compared: each function or method seam, and the
    ``__init__`` of each class an instance seam is read from."""
    names = [f"{s.module}:{s.name}" for s in seams if not s.instance]
    names += [f"{s.module}:{s.name.split('.')[0]}.__init__" for s in seams if s.instance]
    return list(dict.fromkeys(names))


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
    bodies: dict[str, str] = {}
    with zipfile.ZipFile(path) as wheel:
        trees = {}
        for module in sorted({seam.module for seam in seams}):
            name = module_path(module, wheel)
            source = wheel.read(name).decode() if name in wheel.namelist() else ""
            wanted = {seam.name for seam in seams if seam.module == module}
            modules[module] = [name for name in defined_names(source) if name in wanted]
            trees[module] = ast.parse(source)
        for qualified in bodied(seams):
            module, name = qualified.split(":")
            body = body_of(trees[module], name)
            if body is not None:
                bodies[f"{module}.{name}"] = hashlib.sha256(body.encode()).hexdigest()[:16]
    return {
        "version": match.group(2), "wheel": path.name, "sha256": digest, "modules": modules,
        "bodies": bodies,
    }  # fmt: skip


def diff(seam: str, wheels: list[Path]) -> str:
    """The body of ``seam`` (``module.Class.method``) in the first of ``wheels`` and in each
    where it changed, as unified diffs."""
    import difflib

    found: list[tuple[str, str]] = []
    for path in wheels:
        with zipfile.ZipFile(path) as wheel:
            for module in sorted({s.module for seams in ENGINES.values() for s in seams}):
                if seam.startswith(module + ".") and module_path(module, wheel) in wheel.namelist():
                    tree = ast.parse(wheel.read(module_path(module, wheel)).decode())
                    body = body_of(tree, seam[len(module) + 1 :]) or ""
                    if not found or found[-1][1] != body:
                        found.append((path.name, body))
    out = [f"# {found[0][0]}\n{found[0][1]}"] if found else []
    for (before, old), (after, new) in itertools.pairwise(found):
        out.append("".join(difflib.unified_diff(
            old.splitlines(True), new.splitlines(True), before, after
        )))  # fmt: skip
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheels", nargs="+", type=Path,
                        help="the wheels of one engine, oldest first; their seams are printed as "
                        "JSON on stdout")  # fmt: skip
    parser.add_argument("--diff", metavar="SEAM", help="print the body of SEAM "
                        "(module.Class.method or module.function) where it changed")  # fmt: skip
    args = parser.parse_args()
    if args.diff:
        print(diff(args.diff, args.wheels))
        return
    print(json.dumps([read_wheel(path) for path in args.wheels], indent=1))


if __name__ == "__main__":
    main()
