"""What both engine plugins share (``integrations/plugin.py``): the seams checked against every
release read, the bodies compared between releases and each change said in the docs, the version
policy, the patches applied where the seam is, and one way to refuse a bad setting."""

from __future__ import annotations

import importlib.metadata
import itertools
import json
import logging
import subprocess
import sys
import types
from pathlib import Path

import pytest

from mstar_resources.integrations import plugin as engine_plugin
from mstar_resources.integrations import sglang, vllm
from mstar_resources.integrations.plugin import PATCHED, PluginState, Seam, patch_module

ROOT = Path(__file__).parents[2]
DATA = Path(__file__).with_name("data")
ENGINES = {
    "vllm": (vllm, DATA / "vllm_seams.json", ROOT / "docs" / "vllm.md"),
    "sglang": (sglang, DATA / "sglang_seams.json", ROOT / "docs" / "sglang.md"),
}


def _read(engine: str) -> list[dict]:
    return json.loads(ENGINES[engine][1].read_text())


@pytest.fixture(params=sorted(ENGINES))
def engine(request):
    return request.param


def test_each_engine_is_an_extra_of_the_package_and_not_a_dependency(engine):
    """Both plugins install the same way: ``mstar-resources[vllm]``, ``mstar-resources[sglang]``."""
    requires = importlib.metadata.requires("mstar-resources") or []
    assert any(r.startswith(engine) and f'extra == "{engine}"' in r for r in requires)
    assert not any(r.startswith(engine) and "extra" not in r for r in requires)


# -- the seams, in every release's wheel -------------------------------------------------------


def test_every_release_read_is_in_the_seams_file_oldest_first(engine):
    package = ENGINES[engine][0]
    assert [wheel["version"] for wheel in _read(engine)] == list(package.READ_IN)


def test_each_seam_is_in_exactly_the_releases_its_row_says(engine):
    """A seam's ``since``/``until`` are the releases read that have it: where a seam is gone
    (vLLM 0.34's V1 runner) or new (0.33's KV-cache builder), its row says so."""
    package, releases = ENGINES[engine][0], ENGINES[engine][0].READ_IN
    for seam in package.SEAMS:
        first = releases.index(seam.since) if seam.since else 0
        last = releases.index(seam.until) if seam.until else len(releases) - 1
        expected = [r for i, r in enumerate(releases) if first <= i <= last]
        found = [w["version"] for w in _read(engine) if seam.name in w["modules"][seam.module]]
        assert found == expected, seam.qualname


def test_a_seam_a_release_lacks_is_optional_or_in_a_module_that_release_lacks(engine):
    """A required seam is in every release read that imports its module: vLLM 0.34 has no V1
    model runner at all, so its seams, required where it is, are never looked for there."""
    package = ENGINES[engine][0]
    for wheel in _read(engine):
        for seam in package.SEAMS:
            if seam.required and seam.name not in wheel["modules"][seam.module]:
                assert wheel["modules"][seam.module] == [], (seam.qualname, wheel["version"])


def test_every_decision_vllm_reads_from_a_builder_is_one_its_init_makes_in_every_release():
    decisions = {f"FlashInferMetadataBuilder.{name}" for name in vllm.BUILDER_DECISIONS}
    for wheel in _read("vllm"):
        assert decisions <= set(wheel["modules"][vllm.BACKEND]), wheel["version"]


def _changes(engine: str) -> dict[str, list[str]]:
    """By seam (``module's last part.Name``): the releases whose body differs from the release
    read before."""
    changes: dict[str, list[str]] = {}
    wheels = _read(engine)
    for before, after in itertools.pairwise(wheels):
        for name, digest in after["bodies"].items():
            if before["bodies"].get(name, digest) != digest:
                module = next(m for m in after["modules"] if name.startswith(m + "."))
                key = f"{module.rsplit('.', 1)[-1]}.{name[len(module) + 1 :]}"
                changes.setdefault(key, []).append(after["version"])
    return changes


def test_each_body_that_changed_between_releases_is_a_row_of_the_docs(engine):
    """The docs' table of releases names each seam whose body changed, and each release where it
    did, on one line: a change is read and said, not only a name found."""
    page = ENGINES[engine][2].read_text()
    changes = _changes(engine)
    assert changes  # the releases read do differ
    for key, releases in changes.items():
        rows = [line for line in page.splitlines() if f"`{key}`" in line]
        assert rows, f"{key} changed in {releases}, and {ENGINES[engine][2].name} has no row"
        assert all(r in rows[0] for r in releases), (key, releases, rows[0])


def test_the_seams_file_is_what_the_wheels_hold(engine):
    """With ``MSTAR_VLLM_WHEELS`` (``MSTAR_SGLANG_WHEELS``) naming a folder of the releases'
    wheels, the seams file is read from them again and must be the same."""
    import os

    folder = os.environ.get(f"MSTAR_{engine.upper()}_WHEELS")
    if not folder:
        pytest.skip(f"set MSTAR_{engine.upper()}_WHEELS to a folder of the wheels to read them")
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import engine_seams
    finally:
        sys.path.pop(0)
    for wheel in _read(engine):
        assert engine_seams.read_wheel(Path(folder) / wheel["wheel"]) == wheel


# -- the version policy -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("engine", "version", "served"),
    [
        ("vllm", "0.26.0", True),
        ("vllm", "0.30.0", True),
        ("vllm", "0.34.0", True),
        ("vllm", "0.26.1", True),
        ("vllm", "0.35.0rc1+cu130", True),
        ("vllm", "0.25.2", False),
        ("vllm", "0.26.0rc1", False),
        ("vllm", "0.26.0.dev3+gabc", False),
        ("vllm", "0.26.0.post1", True),
        ("sglang", "0.5.19", True),
        ("sglang", "0.5.24", True),
        ("sglang", "0.5.16", False),
    ],
)
def test_every_release_from_the_first_read_is_served(engine, version, served):
    package = ENGINES[engine][0]
    problem = package.version_problem(version)
    assert (problem is None) is served
    if not served:
        assert problem.startswith(f"{package.PLUGIN.setting.engine} {version} is older than every")


def test_no_engine_installed_is_a_problem_named_so(engine):
    package = ENGINES[engine][0]
    assert package.version_problem(None) == f"{package.PLUGIN.setting.engine} is not installed here"


@pytest.mark.parametrize("version", ["", "garbage", "v1"])
def test_a_version_that_is_no_number_is_named_so(engine, version):
    package = ENGINES[engine][0]
    assert package.version_problem(version) == (
        f"{package.PLUGIN.setting.engine}'s version {version!r} is not a version number"
    )


@pytest.mark.parametrize(
    ("engine", "version", "unread"),
    [
        ("vllm", "0.35.0", True),
        ("vllm", "0.26.1", True),
        ("vllm", "0.35.0rc1+cu130", True),
        ("vllm", "0.26.0.post1", True),
        ("vllm", "0.26.0", False),
        ("vllm", "0.34.0+cu130", False),
        ("sglang", "0.5.30", True),
        ("sglang", "0.5.19", False),
    ],
)
def test_a_release_not_read_is_served_with_one_line_saying_so(
    engine, version, unread, monkeypatch, caplog, tmp_path
):
    package = ENGINES[engine][0]
    monkeypatch.setenv(package.ENV_VAR, "auto")
    monkeypatch.setattr(engine_plugin, "installed_version", lambda distribution: version)
    monkeypatch.setattr(package.PLUGIN, "_active", None)
    callbacks = []
    monkeypatch.setattr(engine_plugin, "when_imported", lambda module, cb: callbacks.append(cb))
    monkeypatch.setattr(engine_plugin, "patch_module", lambda state, seams, module: None)
    with caplog.at_level(logging.INFO, logger=package.PLUGIN.state.logger.name):
        package.register()
        # Said as the engine imports a module patched, not at registration: vLLM 0.34 loads its
        # plugins before it sets up its logging, which drops an INFO line said earlier.
        assert package.active() is not None and len(callbacks) > 1 and not caplog.records
        for callback in callbacks:
            callback(types.ModuleType("seam"))
    noted = [
        r for r in caplog.records if "is not a release this plugin was read in" in r.msg % r.args
    ]
    assert len(noted) == unread and all(version in r.getMessage() for r in noted)
    said = [r.getMessage() for r in caplog.records]
    assert sum("FlashInfer workspaces from its pools" in line for line in said) == 1
    assert package.active().unread_release == (version if unread else None)


def test_a_release_older_than_every_one_read_is_one_warning_and_left_as_it_is(
    engine, monkeypatch, caplog
):
    package = ENGINES[engine][0]
    monkeypatch.setenv(package.ENV_VAR, "auto")
    monkeypatch.setattr(engine_plugin, "installed_version", lambda distribution: "0.1.0")
    monkeypatch.setattr(package.PLUGIN, "_active", None)
    with caplog.at_level(logging.WARNING, logger=package.PLUGIN.state.logger.name):
        package.register()
    assert package.active() is None
    name = package.PLUGIN.setting.engine
    assert [r.getMessage() for r in caplog.records] == [
        f"mstar-resources: {package.ENV_VAR}=auto set, but {name} 0.1.0 is older "
        f"than every release this plugin was read in ({', '.join(package.READ_IN)}); "
        f"{name} keeps its own FlashInfer workspace"
    ]


# -- one way to end on a bad setting ------------------------------------------------------------


@pytest.mark.parametrize("value", ["AUTO", "0", "off", "null", "/nowhere/deployment/x.yaml"])
def test_both_plugins_end_a_bad_setting_alike_one_paragraph_and_status_2(engine, value):
    package = ENGINES[engine][0]
    run = (
        f"from mstar_resources.integrations import {engine} as p\n"
        "from mstar_resources.integrations import plugin\n"
        "plugin.installed_version = lambda distribution: p.READ_IN[0]\n"
        "p.register()\n"
    )
    import os

    done = subprocess.run(
        [sys.executable, "-c", run], env={**os.environ, package.ENV_VAR: value},
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [done.stderr.strip()]
    assert done.stderr.startswith(f"mstar-resources: {package.ENV_VAR}={value!r}")


# -- patches as data ----------------------------------------------------------------------------


class _State(PluginState):
    engine = "Engine"

    def __init__(self) -> None:
        super().__init__(vllm.workspaces.Setting("MSTAR_TEST", "auto"))

    @property
    def serving(self) -> bool:
        return False


def _wrapping(tag: str):
    def patch(state, original, owner):
        def replacement(*args):
            return (tag, original(*args))

        return replacement

    return patch


def _module(**names) -> types.ModuleType:
    module = types.ModuleType("engine.module")
    module.__dict__.update(names)
    return module


def test_a_patch_replaces_its_seam_where_the_release_has_it_and_skips_an_optional_one_absent():
    class Runner:
        def profile(self):
            return "profiled"

    module = _module(Runner=Runner, plan=lambda: "planned")
    seams = (
        Seam("engine.module", "Runner.profile", patch=_wrapping("reserved")),
        Seam("engine.module", "plan", patch=_wrapping("routed")),
        Seam("engine.module", "cascade", required=False, patch=_wrapping("never")),
        Seam("other.module", "elsewhere", patch=_wrapping("never")),
    )
    state = _State()
    patch_module(state, seams, module)
    assert Runner().profile() == ("reserved", "profiled")
    assert module.plan() == ("routed", "planned")
    assert not hasattr(module, "cascade") and state.untouched is None
    patch_module(state, seams, module)  # the module handed over again: patched once
    assert module.plan() == ("routed", "planned") and getattr(module.plan, PATCHED)


def test_a_release_that_lacks_a_required_seam_is_left_unpatched_the_seam_named(caplog):
    module = _module(plan=lambda: "planned")
    seams = (
        Seam("engine.module", "plan", patch=_wrapping("routed")),
        Seam("engine.module", "Runner.profile", patch=_wrapping("reserved")),
    )
    state = _State()
    with caplog.at_level(logging.WARNING, logger=state.logger.name):
        patch_module(state, seams, module)
    assert module.plan() == "planned"  # nothing of the module patched
    assert state.blocked == "this Engine lacks engine.module.Runner.profile"
    assert caplog.records[0].getMessage() == (
        "mstar-resources: MSTAR_TEST=auto set, but this Engine lacks engine.module.Runner.profile; "
        "Engine keeps its own FlashInfer workspace"
    )


# -- the bodies compared between releases (scripts/engine_seams.py) ----------------------------


def _engine_seams():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import engine_seams
    finally:
        sys.path.pop(0)
    return engine_seams


def test_a_body_is_compared_without_its_docstring_and_a_change_in_it_is_seen():
    import ast

    read = _engine_seams()
    old = 'class B:\n    def plan(self, x):\n        """Plans."""\n        return x\n'
    reworded = old.replace("Plans.", "Plans x.")
    changed = old.replace("return x", "return x + 1")
    bodies = [read.body_of(ast.parse(src), "B.plan") for src in (old, reworded, changed)]
    assert bodies[0] == bodies[1] and bodies[0] != bodies[2]
    assert '"""' not in bodies[0]
    assert read.body_of(ast.parse(old), "B.absent") is None
    assert read.body_of(ast.parse(old), "B") is None  # a class is read through its __init__
