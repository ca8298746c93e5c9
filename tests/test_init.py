"""The package's facade: the public names, each its home module's own, which load on first use;
the names the docs import and the spec's API of ``mstar_resources.attn.workspace``."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mstar_resources
from mstar_resources.attn import workspace as spec_module

ROOT = Path(__file__).parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _type_checking_imports() -> dict[str, str]:
    """Each name the facade imports under ``TYPE_CHECKING``, and the module it names."""
    source = ast.parse(Path(mstar_resources.__file__).read_text(encoding="utf-8"))
    (block,) = (n for n in source.body if isinstance(n, ast.If))  # if TYPE_CHECKING:
    return {alias.name: "." * node.level + (node.module or "")
            for node in block.body if isinstance(node, ast.ImportFrom)
            for alias in node.names}  # fmt: skip


@pytest.mark.parametrize("name", mstar_resources.__all__)
def test_every_public_name_is_what_the_type_checkers_see(name):
    """The facade hands out the very object a type checker is told it is, which its home module
    defines and lists as public."""
    value = getattr(mstar_resources, name)
    home = importlib.import_module(_type_checking_imports()[name], "mstar_resources")
    assert value.__module__.startswith("mstar_resources.")
    assert getattr(home, name) is value and name in home.__all__
    assert getattr(importlib.import_module(value.__module__), name) is value


def test_a_star_import_gives_exactly_the_public_names():
    assert len(set(mstar_resources.__all__)) == len(mstar_resources.__all__)
    assert sorted(_type_checking_imports()) == sorted(mstar_resources.__all__)
    names: dict[str, object] = {}
    exec("from mstar_resources import *", names)
    del names["__builtins__"]
    assert sorted(names) == sorted(mstar_resources.__all__)
    assert set(mstar_resources.__all__) <= set(dir(mstar_resources))


def _docs_imports() -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for module, names in re.findall(r"^from (mstar_resources[\w.]*) import ([\w, ]+)$", text,
                                        flags=re.MULTILINE):  # fmt: skip
            found += [(module, name.strip()) for name in names.split(",")]
    return found


def test_the_docs_import_some_public_names():
    assert ("mstar_resources", "build_pools") in _docs_imports()


@pytest.mark.parametrize(("module", "name"), _docs_imports())
def test_every_name_the_docs_import_is_exported(module, name):
    assert name in importlib.import_module(module).__all__


SPEC = {
    "Workspace": "(tensor, name, sealed=False, floor='MSTAR_WORKSPACE_BUFFER_MB')",
    "Workspace.plan": "(self, plan, *args, **kwargs)",
    "Workspace.seal": "(self)",
    "WorkspacePool": "(device, size_mb=None, owner='attention')",
    "WorkspacePool.get": "(self, label, cg_slot=None)",
    "WorkspacePool.seal": "(self)",
    "workspace_bytes": "(declared_mb=None)",
}
"""The spec's API of ``mstar_resources.attn.workspace`` (shared/spec/workspace-api.txt)."""


@pytest.mark.parametrize("qualname", SPEC)
def test_the_spec_s_api_stays_as_the_spec_writes_it(qualname):
    """The spec's parameters, in its order with its defaults; what the library adds is
    keyword-only with a default, so every call the spec allows still works."""
    top, _, method = qualname.partition(".")
    assert top in spec_module.__all__ and getattr(mstar_resources, top) is getattr(spec_module, top)
    signature = inspect.signature(getattr(getattr(spec_module, top), method) if method else
                                  getattr(spec_module, top))  # fmt: skip
    added = [p for p in signature.parameters.values() if p.kind is p.KEYWORD_ONLY]
    assert all(p.default is not p.empty for p in added)
    spec = [p.replace(annotation=p.empty) for p in signature.parameters.values() if p not in added]
    assert (
        str(signature.replace(parameters=spec, return_annotation=signature.empty))
        == (SPEC[qualname])
    )


def test_the_spec_s_attributes_are_there():
    pool = spec_module.WorkspacePool("cpu", size_mb=1)
    workspace = pool.get("decode")
    assert isinstance(workspace, spec_module.Workspace)
    assert (workspace.name, workspace.floor, workspace.sealed) == (
        "attention:decode",
        "size_mb",
        False,
    )
    assert isinstance(workspace.tensor, torch.Tensor)
    assert spec_module.workspace_bytes(3) == 3 << 20


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'resolver_'"):
        mstar_resources.resolver_  # noqa: B018


def test_importing_the_package_and_its_conf_imports_no_torch():
    code = "import sys, mstar_resources.conf; print(sorted(m for m in sys.modules if m == 'torch'))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "[]\n"), done.stderr


CORE = {"mstar_resources", "mstar_resources.errors", "mstar_resources.units",
        "mstar_resources._internal", "mstar_resources.floor",
        "mstar_resources.attn",
        "mstar_resources.attn.workspace", "mstar_resources.attn._buffer",
        "mstar_resources.attn._float_workspace", "mstar_resources.attn._int_workspace",
        "mstar_resources.attn._pool", "mstar_resources.attn._overflow",
        "mstar_resources.attn._flashinfer"}  # fmt: skip
"""The modules an engine adopts for its workspaces."""
RESOLVE = "pools = build_pools(resolve({'attn': {'d': {'labels': ['d']}}}), 'cpu')"


@pytest.mark.parametrize(("before", "code", "forbidden", "allowed"), [
    ("", "import mstar_resources.conf", ("mstar_resources.apps",), None),
    ("", "from mstar_resources import resolve, build_pools", (
     "mstar_resources.apps", "mstar_resources.calibration", "mstar_resources.integrations"), None),
    ("", "import mstar_resources.integrations.vllm", ("vllm", "mstar_resources.calibration",
     "mstar_resources.apps", "torch"), None),
    ("import torch, omegaconf", "import mstar_resources.attn.workspace", ("hydra", "tqdm"), CORE),
    ("import torch, omegaconf", f"from mstar_resources.resolver import *; {RESOLVE}; "
     "pools['attn.d'].get('d').tensor", ("hydra", "tqdm"),
     CORE | {"mstar_resources.resolver", "mstar_resources.schema"}),
], ids=["conf", "resolver", "vllm-plugin", "workspace", "resolve"])  # fmt: skip
def test_what_an_engine_imports_loads_nothing_above_it(before, code, forbidden, allowed):
    """In a fresh process, beyond ``before``: the facade loads each name on first use, so the
    core (on torch and OmegaConf) loads its own modules only, and the vLLM plugin no vLLM."""
    probe = f"import sys\n{before}\nold = set(sys.modules)\n{code}\nprint(set(sys.modules) - old)"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    loaded = eval(done.stdout)  # a set of module names
    assert sorted(m for m in loaded if m.startswith(forbidden)) == []
    ours = {m for m in loaded if m.split(".")[0] == "mstar_resources"}
    if allowed is not None:
        assert sorted(ours - allowed) == []
        assert "mstar_resources.attn.workspace" in ours
