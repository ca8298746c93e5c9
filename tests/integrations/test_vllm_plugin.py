"""The vLLM plugin on a CPU: its entry point, its setting, the seams it takes in vLLM's source, and
its wiring of a builder shaped as vLLM's.

What runs in vLLM itself is proven by ``scripts/vllm_proof.py`` on a GPU (docs/vllm.md): here a
stand-in of vLLM's ``FlashInferMetadataBuilder`` (its lazy ``_get_workspace_buffer()``, its
wrapper getters, its ``fast_plan_decode``) is patched as vLLM's is, and planned by a fake
FlashInfer planner that overflows with FlashInfer's own text.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from mstar_resources.errors import ResourceConfigError, WorkspaceSealedError
from mstar_resources.integrations import vllm as plugin
from mstar_resources.units import MIB
from tests.attn.fake_allocator import FakePlanner, FakePrefillWrapper, FakeWrapper

ROOT = Path(__file__).parents[2]
SEAMS_FILE = Path(__file__).with_name("data") / "vllm_seams.json"


# -- the entry point and the setting -------------------------------------------------------------


def test_the_entry_point_is_registered_for_vllms_general_plugins():
    found = {e.name: e for e in importlib.metadata.entry_points(group="vllm.general_plugins")}
    assert found["mstar_resources"].value == "mstar_resources.integrations.vllm:register"
    assert found["mstar_resources"].load() is plugin.register


def test_the_vllm_extra_is_declared_and_not_a_dependency():
    requires = importlib.metadata.requires("mstar-resources") or []
    assert any(r.startswith("vllm") and 'extra == "vllm"' in r for r in requires)
    assert not any(r.startswith("vllm") and "extra" not in r for r in requires)


def test_without_its_setting_the_plugin_does_nothing_and_imports_no_vllm():
    probe = (
        "import sys; from mstar_resources.integrations import vllm as p; p.register(); "
        "print(p.active(), [m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')], "
        "[type(f).__name__ for f in sys.meta_path if 'post_import' in type(f).__module__])"
    )
    env = {k: v for k, v in os.environ.items() if k != plugin.ENV_VAR}
    for value in (None, "", "  "):
        if value is not None:
            env[plugin.ENV_VAR] = value
        done = subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True,
            cwd=ROOT, timeout=120,
        )  # fmt: skip
        assert done.stdout.split() == ["None", "[]", "[]"]


@pytest.mark.parametrize(
    ("value", "named"),
    [
        pytest.param("llama3-8b", "llama3-8b-h200", id="misspelled-deployment"),
        pytest.param("no/such/file.yaml", "deployment file", id="missing-file"),
        pytest.param("llama3-8b-h200.json", "deployment file", id="not-yaml"),
    ],
)
def test_a_bad_setting_is_one_paragraph_naming_the_setting_and_value(value, named):
    with pytest.raises(ResourceConfigError) as raised:
        plugin.read_setting({plugin.ENV_VAR: value})
    text = str(raised.value)
    assert f"{plugin.ENV_VAR}={value!r}" in text
    assert named in text
    assert "\n" not in text


def test_a_deployment_file_outside_a_deployment_folder_is_refused(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("# @package _global_\n")
    with pytest.raises(ResourceConfigError, match="deployment/ folder"):
        plugin.read_setting({plugin.ENV_VAR: str(path)})


def test_a_shipped_calibrated_deployment_gives_its_floors_and_where_they_came_from():
    setting = plugin.read_setting({plugin.ENV_VAR: "llama3-8b-h200_calibrated"})
    assert setting is not None and not setting.auto
    floors = {r.path: (r.floor_mb, r.floor_source, r.floor_setting) for r in setting.records}
    assert floors == {
        "attn.prefill": (17, "declared", "resources.attn.prefill.declared_mb"),
        "attn.decode": (3, "declared", "resources.attn.decode.declared_mb"),
    }


OVER_LLAMA3_8B = "defaults:\n  - llama3-8b-h200\n  - _self_\n"
DECODE_MB = "resources:\n  attn:\n    decode:\n      declared_mb: {}\n"


def deployment_file(tmp_path: Path, body: str) -> Path:
    """``calibrated/deployment/mine.yaml`` under ``tmp_path``: a deployment file of the user's,
    ``# @package _global_`` then ``body``."""
    folder = tmp_path / "calibrated" / "deployment"
    folder.mkdir(parents=True)
    path = folder / "mine.yaml"
    path.write_text("# @package _global_\n" + body)
    return path


def test_a_deployment_file_of_the_users_composes_over_the_shipped_tree(tmp_path):
    path = deployment_file(tmp_path, OVER_LLAMA3_8B + DECODE_MB.format(41))
    setting = plugin.read_setting({plugin.ENV_VAR: str(path)})
    floors = {r.path: r.floor_mb for r in setting.records}
    assert floors == {"attn.prefill": 256, "attn.decode": 41}


def test_the_floor_variable_sizes_what_a_deployment_leaves_undeclared():
    setting = plugin.read_setting({plugin.ENV_VAR: "none", "MSTAR_WORKSPACE_BUFFER_MB": "64"})
    assert {(r.floor_mb, r.floor_source) for r in setting.records} == {(64, "env")}


def test_auto_composes_nothing():
    setting = plugin.read_setting({plugin.ENV_VAR: " auto "})
    assert setting is not None and setting.auto and setting.records == ()


# -- the seams, in vLLM's source ---------------------------------------------------------------


def _read_seams() -> list[dict]:
    return json.loads(SEAMS_FILE.read_text())


def test_every_supported_vllm_has_each_seam_the_plugin_takes():
    read = {wheel["version"]: wheel["modules"] for wheel in _read_seams()}
    assert sorted(read) == sorted(plugin.SUPPORTED_VLLM)
    for version, modules in read.items():
        missing = [
            f"{seam.module}.{seam.name}"
            for seam in plugin.SEAMS
            if seam.required and seam.name not in modules[seam.module]
        ]
        assert missing == [], version
    # What is optional is so because one version lacks it.
    optional = [s for s in plugin.SEAMS if not s.required]
    assert all(any(s.name not in m[s.module] for m in read.values()) for s in optional)


def test_the_seams_file_is_what_the_wheels_hold():
    folder = os.environ.get("MSTAR_VLLM_WHEELS")
    if not folder:
        pytest.skip("set MSTAR_VLLM_WHEELS to a folder of vLLM's wheels to read them again")
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import vllm_seams
    finally:
        sys.path.pop(0)
    for wheel in _read_seams():
        again = vllm_seams.read_wheel(Path(folder) / wheel["wheel"])
        assert again == wheel


def test_a_module_that_lacks_a_seam_is_left_unpatched(caplog):
    workspaces = plugin.VllmWorkspaces(plugin.Setting("auto"))
    module = types.ModuleType(plugin.BACKEND)
    with caplog.at_level(logging.WARNING, logger=plugin.logger.name):
        plugin._patch_backend(workspaces, module)
    assert "FlashInferMetadataBuilder._get_workspace_buffer" in workspaces.untouched
    assert len(caplog.records) == 1


# -- the wiring, on a builder shaped as vLLM's ------------------------------------------------

VLLM_BYTES = 8 * MIB
DECODE_CHAIN = [("batch_decode_tmp_v", 5 * MIB, 16), ("batch_decode_tmp_s", MIB, 16)]
PREFILL_CHAIN = [("batch_prefill_tmp_v", 3 * MIB, 16)]
INDICES = [("batch_decode_request_indices", 2 * MIB, 16)]


class StandInBuilder:
    """vLLM's FlashInferMetadataBuilder in shape: every wrapper built lazily on
    ``self._get_workspace_buffer()``, which makes vLLM's own buffer on first use."""

    decode_chain = DECODE_CHAIN
    indexed = False
    """Decode wrappers that keep an int workspace of their own, as FlashInfer's do."""

    def __init__(self) -> None:
        self.vllm_config, self.device = object(), torch.device("cpu")
        self._workspace_buffer = None
        self._prefill_wrapper = None
        self._decode_wrappers: dict[int, FakePlanner] = {}

    def _get_workspace_buffer(self):
        if self._workspace_buffer is None:
            self._workspace_buffer = torch.zeros(VLLM_BYTES, dtype=torch.uint8)
        return self._workspace_buffer

    def _get_prefill_wrapper(self, causal=True):
        if self._prefill_wrapper is None:
            self._prefill_wrapper = FakePrefillWrapper(self._get_workspace_buffer(), PREFILL_CHAIN)
        return self._prefill_wrapper

    def _get_decode_wrapper(self, batch_size, use_cudagraph=False):
        if batch_size not in self._decode_wrappers:
            chain, buffer = self.decode_chain, self._get_workspace_buffer()
            self._decode_wrappers[batch_size] = (
                FakeWrapper(buffer, INDICES, chain, int_bytes=8 * MIB)
                if self.indexed
                else FakePlanner(buffer, chain)
            )
        return self._decode_wrappers[batch_size]

    def build(self, batch_size):
        """As vLLM's build(): the prefill wrapper's own plan, the decode's through the module's
        fast_plan_decode."""
        self._get_prefill_wrapper().plan()
        backend.fast_plan_decode(self._get_decode_wrapper(batch_size, True))


class StandInRunner:
    def __init__(self) -> None:
        self.vllm_config, self.device = object(), torch.device("cpu")
        self.profiled = self.captured = 0

    def profile_run(self):
        self.profiled += 1

    def capture_model(self, **kwargs):
        self.captured += 1


backend = types.ModuleType(plugin.BACKEND)


@pytest.fixture
def vllm_stand_in(monkeypatch):
    """Fresh stand-in modules of vLLM's, patched by a plugin enabled for the shipped Llama 8B
    deployment with floors of 2 MB (prefill) and 4 MB (decode)."""
    global backend
    backend = types.ModuleType(plugin.BACKEND)
    backend.FlashInferMetadataBuilder = type("FlashInferMetadataBuilder", (StandInBuilder,), {})
    backend.fast_plan_decode = lambda wrapper, *args, **kwargs: wrapper.plan(*args, **kwargs)
    backend.FLASHINFER_PREFILL_WORKSPACE_BYTES_PER_ELEM = 16
    backend.FLASHINFER_WORKSPACE_BUFFER_SIZE_BATCH_INVARIANT = 2 << 30
    runner = types.ModuleType(plugin.RUNNERS[1])
    runner.GPUModelRunner = type("GPUModelRunner", (StandInRunner,), {})
    monkeypatch.setattr(plugin, "uncovered_attention", lambda config: None)
    monkeypatch.setattr(plugin, "vllm_buffer_bytes", lambda config: (VLLM_BYTES, "stand-in"))
    setting = plugin.read_setting(
        {plugin.ENV_VAR: "llama3-8b-h200"}
    )  # declared 256 / 128 MB: lowered for the CPU
    records = tuple(
        type(r)(**{**{f: getattr(r, f) for f in ("path", "owner", "labels", "cg_slots",
                  "floor_source", "floor_setting")}, "declared_mb": mb, "floor_mb": mb})
        for r, mb in zip(setting.records, (2, 4), strict=True)
    )  # fmt: skip
    workspaces = plugin.VllmWorkspaces(plugin.Setting(setting.value, records))
    plugin._patch_backend(workspaces, backend)
    plugin._patch_runner(workspaces, runner)
    return workspaces, backend.FlashInferMetadataBuilder, runner.GPUModelRunner()


def test_the_profile_reserves_both_workspaces_and_vllms_buffer_is_never_made(vllm_stand_in):
    workspaces, Builder, runner = vllm_stand_in
    runner.profile_run()
    assert runner.profiled == 1
    assert workspaces.held_bytes == 6 * MIB
    builders = [Builder(), Builder()]  # V1: one builder per attention group
    for builder in builders:
        builder._get_workspace_buffer()  # V2's runner asks the first builder for its buffer
    prefill = builders[0]._get_prefill_wrapper()
    decodes = [builders[1]._get_decode_wrapper(b, True) for b in (1, 8, 64)]
    pools = workspaces.pools
    assert prefill._float_workspace_buffer is pools["attn.prefill"].get("prefill").tensor
    assert all(d.buffer is pools["attn.decode"].get("decode", 0).tensor for d in decodes)
    assert all(b._workspace_buffer is None for b in builders)
    assert workspaces.report()["builders"] == 2


def test_a_plan_before_the_seal_grows_its_workspace_in_place(vllm_stand_in):
    workspaces, Builder, runner = vllm_stand_in
    runner.profile_run()
    builder = Builder()
    builder.build(8)
    decode = workspaces.pools["attn.decode"].get("decode", 0)
    prefill = workspaces.pools["attn.prefill"].get("prefill")
    assert decode.tensor.numel() == 6 * MIB  # 5 + 1 MiB, from a floor of 4
    assert prefill.tensor.numel() == 3 * MIB  # from a floor of 2
    assert builder._get_prefill_wrapper()._workspace_size == 3 * MIB
    assert workspaces.report()["growths"] == 3  # decode: tmp_v, then tmp_s; prefill: once


def test_capture_seals_and_a_plan_that_no_longer_fits_names_the_setting(vllm_stand_in):
    workspaces, Builder, runner = vllm_stand_in
    runner.profile_run()
    builder = Builder()
    builder.build(8)
    runner.capture_model(profile_only=True)  # 0.33's measuring capture: nothing sealed yet
    assert not workspaces.sealed
    runner.capture_model()
    assert workspaces.sealed and runner.captured == 2
    decode = workspaces.pools["attn.decode"].get("decode", 0)
    address = decode.tensor.data_ptr()
    builder.decode_chain = [("batch_decode_tmp_v", 9 * MIB, 16)]
    with pytest.raises(WorkspaceSealedError) as raised:
        builder.build(16)
    assert raised.value.setting == "resources.attn.decode.declared_mb"
    assert raised.value.suggested_mb == 9
    assert decode.tensor.data_ptr() == address and decode.tensor.numel() == 6 * MIB
    assert workspaces.report()["sealed_overflows"] == 1


def test_a_model_the_plugin_does_not_serve_keeps_vllms_buffer(vllm_stand_in, monkeypatch, caplog):
    workspaces, Builder, runner = vllm_stand_in
    monkeypatch.setattr(plugin, "uncovered_attention", lambda config: "its attention is FLASH_ATTN")
    with caplog.at_level(logging.WARNING, logger=plugin.logger.name):
        runner.profile_run()
        builder = Builder()
        builder.build(8)
    assert builder._workspace_buffer is not None
    assert builder._get_prefill_wrapper()._float_workspace_buffer is builder._workspace_buffer
    assert workspaces.pools == {} and "FLASH_ATTN" in workspaces.untouched
    assert [r.levelno for r in caplog.records] == [logging.WARNING]


def test_a_failure_of_the_plugins_own_leaves_vllm_as_it_is(vllm_stand_in, monkeypatch):
    workspaces, Builder, runner = vllm_stand_in

    def broken(config):
        raise AttributeError("'ModelConfig' object has no attribute 'get_head_size'")

    monkeypatch.setattr(plugin, "vllm_buffer_bytes", broken)
    runner.profile_run()
    runner.capture_model()
    builder = Builder()
    builder.build(8)
    assert builder._workspace_buffer is not None and not workspaces.sealed
    assert "AttributeError" in workspaces.untouched


# -- waiting for a module's import ---------------------------------------------------------------


def test_a_callback_waits_for_the_import_and_the_module_keeps_its_loader(tmp_path, monkeypatch):
    from mstar_resources.integrations._post_import import when_imported

    (tmp_path / "late_module_for_the_hook.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    when_imported("late_module_for_the_hook", lambda m: seen.append(m.VALUE))
    assert seen == []
    import late_module_for_the_hook as module

    assert seen == [41]
    assert type(module.__loader__).__name__ == "SourceFileLoader"
    when_imported("late_module_for_the_hook", lambda m: seen.append(m.VALUE + 1))
    assert seen == [41, 42]  # already imported: at once
    monkeypatch.delitem(sys.modules, "late_module_for_the_hook")


def test_the_first_builders_decode_wrappers_share_the_decode_int_workspace(vllm_stand_in):
    workspaces, Builder, runner = vllm_stand_in
    runner.profile_run()
    first, second = Builder(), Builder()
    first.indexed = second.indexed = True
    shared = workspaces.pools["attn.decode"].get("decode", 0).int_workspace
    decodes = [first._get_decode_wrapper(b, True) for b in (1, 8, 64)]
    assert all(d._int_workspace_buffer is shared.tensor for d in decodes)
    assert all(d._pin_memory_int_workspace_buffer is shared.mirror for d in decodes)
    # Another KV-cache group's builder plans its wrapper before either runs: it keeps its own.
    other = second._get_decode_wrapper(8, True)
    assert other._int_workspace_buffer is not shared.tensor
    assert other._int_workspace_buffer.numel() == 8 * MIB
    # The prefill wrappers keep their own (several may be planned in one step).
    assert first._get_prefill_wrapper()._float_workspace_buffer is not None
    report = workspaces.report()
    assert report["shared_int_wrappers"] == 3
    first.build(8)
    assert shared.tensor.numel() == 8 * MIB  # FlashInfer's 8 MiB, the default floor, holds it
    assert decodes[1].plans == 3  # planned, and planned again after each float growth


def test_a_deployment_file_whose_resources_are_wrong_names_the_setting_and_the_key(tmp_path):
    path = deployment_file(tmp_path, OVER_LLAMA3_8B + DECODE_MB.format(0))
    with pytest.raises(ResourceConfigError) as raised:
        plugin.read_setting({plugin.ENV_VAR: str(path)})
    assert str(raised.value).startswith(f"{plugin.ENV_VAR}={path}: ")
    assert "resources.attn.decode.declared_mb=0" in str(raised.value)


def test_a_deployment_that_does_not_compose_is_one_paragraph(tmp_path):
    path = deployment_file(tmp_path, "defaults:\n  - no-such-deployment\n")
    with pytest.raises(ResourceConfigError) as raised:
        plugin.read_setting({plugin.ENV_VAR: str(path)})
    assert f"{plugin.ENV_VAR}={str(path)!r}" in str(raised.value)
    assert "\n" not in str(raised.value)


def test_register_leaves_an_unsupported_vllm_untouched(monkeypatch, caplog):
    """With the setting on and a vLLM the seams were not read in (here: none installed), the
    plugin says why once and patches nothing."""
    monkeypatch.setenv(plugin.ENV_VAR, "llama3-8b-h200")
    monkeypatch.setattr(plugin, "vllm_version", lambda: "0.1.0")
    monkeypatch.setattr(plugin, "_active", None)
    with caplog.at_level(logging.WARNING, logger=plugin.__name__):
        plugin.register()
    assert plugin.active() is None
    assert "vLLM 0.1.0 is not one this plugin was read in" in caplog.text


def test_the_decode_graph_sizes_are_vllms_capture_sizes_up_to_its_cap():
    compilation = types.SimpleNamespace(
        max_cudagraph_capture_size=32, cudagraph_capture_sizes=[1, 2, 4, 8, 16, 32, 64, 128]
    )
    config = types.SimpleNamespace(
        compilation_config=compilation, scheduler_config=types.SimpleNamespace(max_num_seqs=16)
    )
    assert plugin._decode_graph_sizes(config) == [1, 2, 4, 8, 16]  # max_num_seqs caps it
    compilation.max_cudagraph_capture_size = None
    config.scheduler_config.max_num_seqs = 256
    assert plugin._decode_graph_sizes(config) == [1, 2, 4, 8, 16, 32, 64, 128]
