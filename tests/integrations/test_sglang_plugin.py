"""The SGLang plugin where there is no SGLang: its entry point, its setting, its seams read in
SGLang's wheels, and what it does in a worker, on stand-ins of SGLang's model runner, buffer
registry and FlashInfer backend, whose wrappers fail as FlashInfer's allocator does."""

from __future__ import annotations

import importlib.metadata
import logging
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from mstar_resources import ResourceConfigError, WorkspacePlanError, WorkspaceSealedError
from mstar_resources.integrations import sglang as plugin
from mstar_resources.integrations.plugin import patch_module
from mstar_resources.integrations.sglang import workspaces
from mstar_resources.integrations.sglang.measure import SglangPlans
from tests.attn.fake_allocator import FakePlanner

ROOT = Path(__file__).parents[2]
SEAMS_FILE = Path(__file__).with_name("data") / "sglang_seams.json"
MIB = 1 << 20


# -- the entry point and the setting ----------------------------------------------------------


def test_the_entry_point_is_registered_for_sglangs_general_plugins():
    found = {e.name: e for e in importlib.metadata.entry_points(group="sglang.srt.plugins")}
    assert found["mstar_resources"].value == "mstar_resources.integrations.sglang:register"
    assert found["mstar_resources"].load() is plugin.register


def test_without_its_setting_the_plugin_does_nothing_and_imports_no_sglang():
    probe = (
        "import os, sys; from mstar_resources.integrations import sglang as p\n"
        f"for value in (None, '', '  '):\n"
        f"    os.environ.pop({plugin.ENV_VAR!r}, None) if value is None else "
        f"os.environ.__setitem__({plugin.ENV_VAR!r}, value)\n"
        "    p.register()\n"
        "from mstar_resources.integrations import plugin as f\n"
        "print(p.active(), [m for m in sys.modules if m.split('.')[0] in ('sglang', 'vllm')], "
        "f._finder in sys.meta_path)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT,
        timeout=120,
    )  # fmt: skip
    assert done.stdout.split() == ["None", "[]", "False"]


def test_a_bad_setting_stops_the_process_with_status_2_and_one_paragraph():
    run = "from mstar_resources.integrations import sglang; sglang.register()"
    done = subprocess.run(
        [sys.executable, "-c", run], env={**os.environ, plugin.ENV_VAR: "nope"},
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [done.stderr.strip()]  # one paragraph
    assert done.stderr.startswith(f"mstar-resources: {plugin.ENV_VAR}='nope' is not a setting")
    assert f"unset {plugin.ENV_VAR}" in done.stderr


@pytest.mark.parametrize("value", ["none", "/nowhere/deployment/x.yaml"])
def test_each_bad_setting_exits_2_naming_the_setting_and_its_value(value, monkeypatch, capsys):
    monkeypatch.setenv(plugin.ENV_VAR, value)
    with pytest.raises(SystemExit) as stopped:
        plugin.register()
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mstar-resources: {plugin.ENV_VAR}={value!r}") and err.count("\n") == 1


def test_auto_is_taken_and_offered_where_a_setting_is_close():
    setting = plugin.SGLANG.read({plugin.ENV_VAR: "auto"})
    assert setting is not None and setting.auto and setting.records == ()
    with pytest.raises(ResourceConfigError) as unknown:
        plugin.SGLANG.read({plugin.ENV_VAR: "aut"})
    assert "did you mean auto?" in str(unknown.value)


# -- the seams (every release's: test_plugin.py) ------------------------------------------------


def test_a_module_that_lacks_a_seam_is_left_unpatched(tmp_path):
    served = _served(tmp_path)
    module = types.ModuleType(plugin.RUNNER)
    patch_module(served, plugin.SEAMS, module)
    assert served.untouched is not None and "ModelRunner.alloc_memory_pool" in served.untouched


# -- in a worker, on stand-ins of SGLang's classes ---------------------------------------------


def _deployment(tmp_path: Path, prefill_mb: int = 1, decode_mb: int = 2) -> Path:
    path = tmp_path / "deployment" / "mine.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "# @package _global_\nresources:\n  attn:\n"
        f"    prefill:\n      declared_mb: {prefill_mb}\n"
        f"    decode:\n      declared_mb: {decode_mb}\n      int_declared_mb: 1\n"
    )
    return path


def _served(tmp_path: Path) -> workspaces.SglangWorkspaces:
    setting = plugin.SGLANG.read({plugin.ENV_VAR: str(_deployment(tmp_path))})
    assert setting is not None
    return workspaces.SglangWorkspaces(setting)


class Wrapper:
    """FlashInfer's wrappers as SGLang's backend holds them: built on a float buffer whose size
    they record, planning with ``begin_forward`` (here: one allocation of ``need`` bytes)."""

    def __init__(self, float_workspace_buffer: torch.Tensor, layout: str = "NHD", **_: Any):
        self._float_workspace_buffer = float_workspace_buffer
        self._workspace_size = float_workspace_buffer.numel()
        # FlashInfer's own 8 MiB int workspace and its pinned mirror (smaller here).
        self._int_workspace_buffer = torch.empty(64, dtype=torch.uint8)
        self._pin_memory_int_workspace_buffer = torch.empty(64, dtype=torch.uint8)

    def run(self, *args: Any, **kwargs: Any) -> str:
        return "ran"

    def begin_forward(self, *args: Any, need: int = 0, **kwargs: Any) -> str:
        FakePlanner(self._float_workspace_buffer, [("batch_prefill_tmp_v", need, 16)])()
        return "planned"


class Ragged(Wrapper):
    pass


class Paged(Wrapper):
    pass


class Decode(Wrapper):
    pass


def fast_decode_plan(wrapper: Any, *args: Any, need: int = 0, **kwargs: Any) -> str:
    """SGLang's graph-mode decode plan (FlashInfer's ``fast_decode_plan``)."""
    FakePlanner(wrapper._float_workspace_buffer, [("batch_decode_tmp_v", need, 16)])()
    return "fast"


def fast_prefill_plan(wrapper: Any, *args: Any, need: int = 0, **kwargs: Any) -> str:
    """SGLang's graph-mode prefill plan (verify and draft-extend graphs)."""
    FakePlanner(wrapper._float_workspace_buffer, [("batch_prefill_tmp_v", need, 16)])()
    return "fast prefill"


class Registry:
    """SGLang's process-level buffers (``runtime_context.get_buffer``)."""

    def __init__(self) -> None:
        self.buffers: dict[str, Any] = {}
        self.made: list[int] = []
        """The bytes of each buffer a factory made."""

    def get_buffer(self, name: str, factory: Any) -> Any:
        if name not in self.buffers:
            self.buffers[name] = factory()
            self.made.append(self.buffers[name].numel())
        return self.buffers[name]


def _stand_ins(
    registry: Registry, served: workspaces.SglangWorkspaces
) -> tuple[types.ModuleType, types.ModuleType]:
    """SGLang's model runner and FlashInfer backend modules, as the plugin sees them."""
    runner_module = types.ModuleType(plugin.RUNNER)
    backend_module = types.ModuleType(plugin.BACKEND)

    class ModelRunner:
        device, gpu_id = "cpu", 0

        def __init__(self, mla: bool = False) -> None:
            self.use_mla_backend = mla
            self.held_at_kv_sizing: int | None = None
            self.captured = False

        def alloc_memory_pool(self) -> None:  # sizes the KV pool from the memory left
            self.held_at_kv_sizing = served.held_bytes

        def init_cuda_graphs(self, capture_decode_cuda_graph: bool = True) -> None:
            self.captured = True
            self.decode_cuda_graph_captured = capture_decode_cuda_graph

        def ensure_decode_cuda_graphs(self, capture_bs: list[int] | None = None) -> None:
            # SGLang 0.5.21+: a prefill instance switching to decode captures its decode graphs.
            self.decode_cuda_graph_captured = True

    class FlashInferAttnBackend:
        def __init__(
            self, runner: Any, init_new_workspace: bool = False, num_wrappers: int = 1
        ) -> None:
            self.num_wrappers = num_wrappers
            # SGLang 0.5.23 sets 512 MiB for Qwen3 before it asks the registry.
            shared = registry.get_buffer(
                "flashinfer_workspace", lambda: torch.empty(512 * MIB, dtype=torch.uint8)
            )
            self.workspace_buffer = torch.empty(4 * MIB, dtype=torch.uint8) if (
                init_new_workspace) else shared  # fmt: skip
            module = backend_module
            self.prefill_wrapper_ragged = module.BatchPrefillWithRaggedKVCacheWrapper(
                self.workspace_buffer
            )
            self.prefill_wrappers_paged = [module.BatchPrefillWithPagedKVCacheWrapper(
                self.workspace_buffer) for _ in range(2)]  # fmt: skip
            self.prefill_wrappers_verify = [module.BatchPrefillWithPagedKVCacheWrapper(
                self.workspace_buffer) for _ in range(2)]  # fmt: skip
            self.decode_wrappers = [module.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace_buffer) for _ in range(num_wrappers)]  # fmt: skip
            self.decode_cuda_graph_metadata: dict[int, list[Any]] = {}

        def _create_decode_wrappers(self, bs: int, num_tokens: int) -> list[Any]:
            return [
                backend_module.BatchDecodeWithPagedKVCacheWrapper(self.workspace_buffer)
                for _ in range(self.num_wrappers)
            ]

        def capture(self, bs: int) -> None:  # a decode graph of ``bs`` requests
            self.decode_cuda_graph_metadata[bs] = self._create_decode_wrappers(bs, bs)

    runner_module.ModelRunner = ModelRunner  # type: ignore[attr-defined]
    backend_module.FlashInferAttnBackend = FlashInferAttnBackend  # type: ignore[attr-defined]
    backend_module.fast_decode_plan = fast_decode_plan  # type: ignore[attr-defined]
    backend_module.fast_prefill_plan = fast_prefill_plan  # type: ignore[attr-defined]
    backend_module.should_use_tensor_core = lambda **_: True  # type: ignore[attr-defined]
    # Classes of their own, so that patching them leaves the next test's unpatched.
    for name, base in zip(plugin.WRAPPERS, (Ragged, Paged, Decode), strict=True):
        setattr(backend_module, name, type(name, (base,), {}))
    return runner_module, backend_module


@pytest.fixture
def worker(tmp_path, monkeypatch):
    """A worker with the plugin's patches applied to the stand-ins, its runtime context's
    ``get_buffer`` the stand-in registry's."""
    served = _served(tmp_path)
    return (served, *_patched_stand_ins(served, monkeypatch))


def _patched_stand_ins(
    served: workspaces.SglangWorkspaces, monkeypatch: pytest.MonkeyPatch
) -> tuple[Registry, types.ModuleType, types.ModuleType]:
    """The stand-ins of SGLang's modules, patched by the plugin for ``served``, SGLang's runtime
    context's ``get_buffer`` the stand-in registry's."""
    registry = Registry()
    runner_module, backend_module = _stand_ins(registry, served)
    context = types.ModuleType(plugin.CONTEXT)
    context.get_buffer = registry.get_buffer  # type: ignore[attr-defined]
    for name in ("sglang", "sglang.srt"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, plugin.CONTEXT, context)
    monkeypatch.setitem(sys.modules, plugin.BACKEND, backend_module)
    patch_module(served, plugin.SEAMS, runner_module)
    patch_module(served, plugin.SEAMS, backend_module)
    return registry, runner_module, backend_module


def test_the_workspaces_are_made_before_sglang_sizes_its_kv_pool_and_taken_from_its_registry(
    worker,
):
    served, registry, runner_module, backend_module = worker
    runner = runner_module.ModelRunner()
    runner.alloc_memory_pool()
    # Held when SGLang sizes its KV pool: the deployment's 1 + 2 MB, no int workspace.
    assert runner.held_at_kv_sizing == served.held_bytes == 3 * MIB
    decode, prefill = served.workspaces["decode"], served.workspaces["prefill"]
    assert registry.buffers["flashinfer_workspace"] is decode.tensor
    backend = backend_module.FlashInferAttnBackend(runner)
    assert registry.made == [2 * MIB]  # the plugin's; SGLang's 512 MiB is never allocated
    assert backend.workspace_buffer is decode.tensor
    assert all(w._float_workspace_buffer is decode.tensor for w in backend.decode_wrappers)
    prefills = [backend.prefill_wrapper_ragged, *backend.prefill_wrappers_paged,
                *backend.prefill_wrappers_verify]  # fmt: skip
    assert all(w._float_workspace_buffer is prefill.tensor for w in prefills)
    assert all(w._workspace_size == prefill.tensor.numel() for w in prefills)
    assert served.report()["backends"] == 1


def test_a_deployment_that_declares_vllms_manager_too_makes_sglangs_workspaces_alone(
    tmp_path, monkeypatch, caplog
):
    """A deployment of vLLM's plans (vLLM's WorkspaceManager beside attention) served to SGLang:
    only the workspaces SGLang's wrappers plan on are made, and the log names the rest."""
    path = _deployment(tmp_path)
    path.write_text(
        path.read_text() + "  vllm:\n    workspace_manager: {owner: vllm, labels: "
        "[workspace_manager], cg_slots: [0], declared_mb: 64, int_declared_mb: 0}\n"
    )
    setting = plugin.SGLANG.read({plugin.ENV_VAR: str(path)})
    assert setting is not None
    served = workspaces.SglangWorkspaces(setting)
    _, runner_module, _ = _patched_stand_ins(served, monkeypatch)
    runner = runner_module.ModelRunner()
    with caplog.at_level(logging.INFO, logger=workspaces.logger.name):
        runner.alloc_memory_pool()
    assert runner.held_at_kv_sizing == served.held_bytes == 3 * MIB  # not the manager's 64 MB
    assert "plans on it: resources.vllm.workspace_manager (another engine's" in caplog.text


def test_a_subclass_of_sglangs_flashinfer_backend_is_adopted_as_the_backend(worker, caplog):
    """SGLang 0.5.22's LLaDA2 CFG backend builds the FlashInfer backend's wrappers, adopted as
    the backend's, then a ragged prefill wrapper of its own on the decode workspace's buffer."""
    served, _, runner_module, backend_module = worker
    runner = runner_module.ModelRunner()
    runner.alloc_memory_pool()

    def init(self, runner):
        backend_module.FlashInferAttnBackend.__init__(self, runner)
        ragged = backend_module.BatchPrefillWithRaggedKVCacheWrapper
        self._cfg_prefill_wrapper_ragged = ragged(self.workspace_buffer)

    llada2 = type("LLaDA2CFGFlashInferAttnBackend", (backend_module.FlashInferAttnBackend,), {})
    llada2.__init__ = init
    with caplog.at_level(logging.INFO, logger=workspaces.logger.name):
        backend = llada2(runner)
    prefill, decode = served.workspaces["prefill"], served.workspaces["decode"]
    assert backend._cfg_prefill_wrapper_ragged._float_workspace_buffer is decode.tensor
    assert backend.prefill_wrapper_ragged._float_workspace_buffer is prefill.tensor
    assert all(w._float_workspace_buffer is decode.tensor for w in backend.decode_wrappers)
    report = served.report()
    assert (report["backends"], report["other_backends"]) == (1, [])
    assert "TRT-LLM" not in caplog.text


def test_sglangs_trtllm_mha_backend_built_on_its_flashinfer_backend_is_not_adopted(worker, caplog):
    """SGLang's TRT-LLM MHA backend subclasses its FlashInfer backend, runs XQA and FMHA-v2 on a
    zeroed workspace of its own, and plans no FlashInfer wrapper: not counted as served."""
    served, _, runner_module, backend_module = worker
    runner = runner_module.ModelRunner()
    runner.alloc_memory_pool()
    trtllm = type("TRTLLMHAAttnBackend", (backend_module.FlashInferAttnBackend,), {})
    with caplog.at_level(logging.INFO, logger=workspaces.logger.name):
        trtllm(runner)
        trtllm(runner)
    report = served.report()
    assert report["backends"] == 0 and report["other_backends"] == ["TRTLLMHAAttnBackend"]
    assert caplog.text.count("TRTLLMHAAttnBackend runs TRT-LLM's kernels") == 1
    backend_module.FlashInferAttnBackend(runner)
    assert served.report()["backends"] == 1


def test_a_plan_grows_its_workspace_in_place_before_the_seal_and_is_refused_after(worker):
    served, _, runner_module, backend_module = worker
    runner = runner_module.ModelRunner()
    runner.alloc_memory_pool()
    backend = backend_module.FlashInferAttnBackend(runner)
    prefill, decode = served.workspaces["prefill"], served.workspaces["decode"]
    tensor = prefill.tensor
    assert backend.prefill_wrappers_paged[0].begin_forward(need=3 * MIB) == "planned"
    assert prefill.tensor is tensor and tensor.numel() == 3 * MIB  # grown in place
    assert backend.prefill_wrappers_paged[1]._workspace_size == 1 * MIB  # not yet planned
    runner.init_cuda_graphs()
    assert runner.captured and served.sealed_before is not None
    address = decode.tensor.data_ptr()
    wrapper = backend.decode_wrappers[0]
    # SGLang's graph decode wrappers plan with fast_decode_plan, looked up in its module.
    assert backend_module.fast_decode_plan(wrapper, need=MIB) == "fast"
    with pytest.raises(WorkspaceSealedError) as refused:
        backend_module.fast_decode_plan(wrapper, need=5 * MIB)
    assert refused.value.setting == "resources.attn.decode.declared_mb"
    assert refused.value.suggested_mb is not None and refused.value.suggested_mb >= 5
    assert decode.tensor.data_ptr() == address and decode.tensor.numel() == 2 * MIB
    # So do its verify graphs' prefill wrappers, made on the decode workspace, with its own.
    verify = backend_module.BatchPrefillWithPagedKVCacheWrapper(backend.workspace_buffer)
    assert backend_module.fast_prefill_plan(verify, need=MIB) == "fast prefill"
    with pytest.raises(WorkspaceSealedError):
        backend_module.fast_prefill_plan(verify, need=5 * MIB)
    assert served.report()["sealed_overflows"] == 2
    assert served.report()["growths"] == 1


def test_decode_graphs_captured_after_the_seal_are_named_once_and_held_to_the_sealed_floor(
    worker, caplog
):
    """SGLang's PD role switch: an instance launched as prefill (no decode graph) captures its
    decode graphs after startup, over the sealed workspaces."""
    served, _, runner_module, backend_module = worker
    runner = runner_module.ModelRunner()
    runner.alloc_memory_pool()
    backend = backend_module.FlashInferAttnBackend(runner)
    runner.init_cuda_graphs(capture_decode_cuda_graph=False)
    decode = served.workspaces["decode"]
    with caplog.at_level(logging.WARNING, logger=workspaces.logger.name):
        runner.ensure_decode_cuda_graphs()
        runner.ensure_decode_cuda_graphs()  # captured: SGLang skips it, the plugin says nothing
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert f"'{decode.name}' of {2 * MIB:,} bytes" in warnings[0]
    assert "resources.attn.decode.declared_mb" in warnings[0]
    with pytest.raises(WorkspaceSealedError) as refused:
        backend_module.fast_decode_plan(backend.decode_wrappers[0], need=5 * MIB)
    assert refused.value.setting == "resources.attn.decode.declared_mb"
    assert decode.tensor.numel() == 2 * MIB


def test_decode_graphs_captured_at_startup_need_no_word_at_a_role_switch(worker, caplog):
    _, _, runner_module, backend_module = worker
    runner = runner_module.ModelRunner()
    runner.alloc_memory_pool()
    backend_module.FlashInferAttnBackend(runner)
    runner.init_cuda_graphs()
    with caplog.at_level(logging.WARNING, logger=workspaces.logger.name):
        runner.ensure_decode_cuda_graphs()
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_a_wrapper_on_a_buffer_not_the_plugins_plans_as_flashinfer_does(worker):
    served, _, runner_module, backend_module = worker
    runner_module.ModelRunner().alloc_memory_pool()
    foreign = backend_module.BatchPrefillWithPagedKVCacheWrapper(
        torch.empty(MIB, dtype=torch.uint8)
    )
    with pytest.raises(RuntimeError) as raised:
        foreign.begin_forward(need=2 * MIB)
    assert not isinstance(raised.value, WorkspaceSealedError)
    assert foreign._float_workspace_buffer.numel() == MIB
    assert served.report()["growths"] == 0


def test_a_backend_that_makes_its_own_workspace_keeps_it_with_one_warning(worker, caplog):
    served, _, runner_module, backend_module = worker
    runner = runner_module.ModelRunner()
    runner.alloc_memory_pool()
    with caplog.at_level(logging.WARNING, logger=workspaces.logger.name):
        for _ in range(2):  # a speculative worker's backends
            backend = backend_module.FlashInferAttnBackend(runner, init_new_workspace=True)
    assert backend.workspace_buffer is not served.workspaces["decode"].tensor
    assert served.report()["own_workspaces"] == 2
    assert len(caplog.records) == 1 and "init_new_workspace" in caplog.records[0].getMessage()


def test_a_registry_that_already_holds_sglangs_buffer_leaves_sglang_as_it_is(worker, caplog):
    served, registry, runner_module, backend_module = worker
    theirs = registry.get_buffer(
        "flashinfer_workspace", lambda: torch.empty(MIB, dtype=torch.uint8)
    )
    runner = runner_module.ModelRunner()
    with caplog.at_level(logging.WARNING, logger=workspaces.logger.name):
        runner.alloc_memory_pool()
    assert not served.serving and served.held_bytes == 0
    assert "flashinfer_workspace" in (served.untouched or "")
    backend = backend_module.FlashInferAttnBackend(runner)
    assert backend.workspace_buffer is theirs
    runner.init_cuda_graphs()
    assert served.sealed_before is None
    assert len(caplog.records) == 1


def test_the_plans_are_patched_once_if_the_backend_is_patched_again(worker):
    served, _, _, backend_module = worker

    def planners() -> tuple[Any, ...]:
        return (backend_module.BatchDecodeWithPagedKVCacheWrapper.begin_forward,
                backend_module.fast_decode_plan, backend_module.fast_prefill_plan)  # fmt: skip

    planned = planners()
    patch_module(served, plugin.SEAMS, backend_module)
    assert planners() == planned


def test_an_mla_model_leaves_sglang_as_it_is(worker):
    served, registry, runner_module, _ = worker
    runner_module.ModelRunner(mla=True).alloc_memory_pool()
    assert served.untouched is not None and served.untouched.startswith("the model's attention")
    assert served.held_bytes == 0 and registry.buffers == {}


def test_a_seal_with_no_flashinfer_backend_built_says_what_is_held_for_nothing(worker, caplog):
    served, _, runner_module, _ = worker
    runner = runner_module.ModelRunner()  # attention on another backend: none built
    runner.alloc_memory_pool()
    with caplog.at_level(logging.WARNING, logger=workspaces.logger.name):
        runner.init_cuda_graphs()
    assert served.sealed_before is not None
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    message = caplog.records[0].getMessage()
    assert "no FlashInfer backend" in message and "3,145,728 bytes held for nothing" in message


def test_the_seal_line_counts_float_and_int_bytes_apart(worker, caplog):
    served, _, runner_module, backend_module = worker
    runner = runner_module.ModelRunner()
    runner.alloc_memory_pool()
    backend_module.FlashInferAttnBackend(runner).capture(8)
    with caplog.at_level(logging.INFO, logger=workspaces.logger.name):
        runner.init_cuda_graphs()
    floats = sum(s.bytes for s in served.stats() if s.kind == "float")
    sealed = [m for m in caplog.messages if m.startswith("mstar-resources: sealed")]
    assert len(sealed) == 1 and sealed[0].startswith(
        f"mstar-resources: sealed 3 FlashInfer workspaces, {floats:,} bytes of float and "
        f"{MIB:,} of int, before SGLang "
    )


def test_the_decode_wrappers_share_one_int_workspace_and_the_prefill_wrappers_keep_theirs(
    worker,
):
    served, _, runner_module, backend_module = worker
    runner = runner_module.ModelRunner()
    runner.alloc_memory_pool()
    backend = backend_module.FlashInferAttnBackend(runner)
    for bs in (8, 16):
        backend.capture(bs)
    shared = served.workspaces["decode"].int_workspace
    assert shared is not None and shared.tensor.numel() == MIB  # the deployment's 1 MB
    decodes = [*backend.decode_wrappers, *backend.decode_cuda_graph_metadata[8],
               *backend.decode_cuda_graph_metadata[16]]  # fmt: skip
    assert all(w._int_workspace_buffer is shared.tensor for w in decodes)
    assert all(w._pin_memory_int_workspace_buffer.numel() == MIB for w in decodes)
    prefills = [backend.prefill_wrapper_ragged, *backend.prefill_wrappers_paged]
    assert all(w._int_workspace_buffer.numel() == 64 for w in prefills)  # their own
    assert served.report()["shared_int_wrappers"] == 3
    assert served.report()["int_workspace_bytes"] == MIB
    # Planned, then run: a wrapper runs on its own plan; one whose plan was overwritten is
    # refused rather than reading another's indices.
    graph8, graph16 = (
        backend.decode_cuda_graph_metadata[8][0],
        backend.decode_cuda_graph_metadata[16][0],
    )
    backend_module.fast_decode_plan(graph8, need=1024)
    assert graph8.run() == "ran"
    with pytest.raises(WorkspacePlanError):
        graph16.run()


@pytest.mark.parametrize("second", ["another backend", "a pair of wrappers a batch"])
def test_wrappers_planned_several_before_they_run_keep_their_own_int_workspace(worker, second):
    _, _, runner_module, backend_module = worker
    runner = runner_module.ModelRunner()
    runner.alloc_memory_pool()
    if second == "another backend":  # a multi-step draft's backends, after the target's
        backend_module.FlashInferAttnBackend(runner)
        backend = backend_module.FlashInferAttnBackend(runner)
    else:  # a sliding-window model's: one wrapper for each kind of layer
        backend = backend_module.FlashInferAttnBackend(runner, num_wrappers=2)
    backend.capture(8)
    for wrapper in [*backend.decode_wrappers, *backend.decode_cuda_graph_metadata[8]]:
        assert wrapper._int_workspace_buffer.numel() == 64


# -- auto: the floors measured in the worker -----------------------------------------------------

PLANS = SglangPlans(32, 8, 128, 1, "bfloat16", "bfloat16", 128, 4096, 4096, (1, 2, 4))


@pytest.fixture
def auto_worker(monkeypatch):
    """A worker with ``auto`` set; the measurement (FlashInfer's plans on the GPU,
    ``scripts/sglang_proof.py``) gives 3 and 5 MB here, or fails where ``measured`` holds an
    error first."""
    setting = plugin.SGLANG.read({plugin.ENV_VAR: "auto"})
    assert setting is not None
    served = workspaces.SglangWorkspaces(setting)
    measured: list[Any] = []

    def measure(plans: SglangPlans, device: Any) -> tuple[list[Any], dict[str, str]]:
        if measured and isinstance(measured[0], Exception):
            raise measured[0]
        measured.append(plans)
        floors = {"attn.prefill": (3, 0), "attn.decode": (5, 0)}
        return plans.resources(floors), {"attn.decode": "measured here: need 5,000,000 bytes"}

    monkeypatch.setattr(workspaces, "measure", measure)
    registry, runner_module, _ = _patched_stand_ins(served, monkeypatch)
    return served, registry, runner_module, measured


def test_auto_reserves_the_measured_floors_before_sglang_sizes_its_kv_pool(
    auto_worker, monkeypatch, caplog
):
    served, registry, runner_module, measured = auto_worker
    monkeypatch.setattr(workspaces, "sglang_plans", lambda runner, context, rule: PLANS)
    runner = runner_module.ModelRunner()
    with caplog.at_level(logging.INFO, logger=workspaces.logger.name):
        runner.alloc_memory_pool()
    assert measured == [PLANS]
    assert runner.held_at_kv_sizing == served.held_bytes == 8 * MIB
    assert registry.buffers["flashinfer_workspace"] is served.workspaces["decode"].tensor
    decode_line = next(r.getMessage() for r in caplog.records if ":decode" in r.getMessage())
    assert "5,242,880 bytes" in decode_line and "measured here: need 5,000,000" in decode_line
    assert served.report()["provenance"] == {"attn.decode": "measured here: need 5,000,000 bytes"}


def test_auto_leaves_a_model_it_cannot_plan_to_sglang_saying_why(auto_worker, monkeypatch, caplog):
    served, registry, runner_module, measured = auto_worker
    monkeypatch.setattr(
        workspaces,
        "sglang_plans",
        lambda runner, context, rule: "the model has sliding-window layers",
    )
    with caplog.at_level(logging.WARNING, logger=workspaces.logger.name):
        runner_module.ModelRunner().alloc_memory_pool()
    assert measured == [] and registry.buffers == {} and served.held_bytes == 0
    assert not served.serving
    (message,) = [r.getMessage() for r in caplog.records]
    assert "MSTAR_RESOURCES_SGLANG=auto set, but the model has sliding-window layers" in message
    assert "SGLang keeps its own FlashInfer workspace" in message


def test_auto_whose_measurement_fails_leaves_sglang_as_it_is(auto_worker, monkeypatch, caplog):
    served, registry, runner_module, measured = auto_worker
    monkeypatch.setattr(workspaces, "sglang_plans", lambda runner, context, rule: PLANS)
    measured.append(ResourceConfigError("calibration.model.head_dim=96 is not valid"))
    runner = runner_module.ModelRunner()
    with caplog.at_level(logging.WARNING, logger=workspaces.logger.name):
        runner.alloc_memory_pool()  # SGLang goes on and sizes its KV pool
    assert runner.held_at_kv_sizing == 0 and registry.buffers == {} and not served.serving
    (message,) = [r.getMessage() for r in caplog.records]
    assert "head_dim=96" in message and "SGLang keeps its own FlashInfer workspace" in message


def test_a_phase_whose_plans_take_no_float_workspace_names_no_worst_shape(monkeypatch):
    """``auto``'s provenance where a label's plans take no float workspace (FlashInfer's FA3
    prefill): the need of 0 is said as such, with no shape named; a need names its shape."""
    import mstar_resources.calibration.calibrate as calibrate
    from mstar_resources.calibration.measure import Need
    from mstar_resources.integrations.sglang import measure

    def measured(records, profile, device, show_progress):
        return [calibrate.LabelNeed(r, label, Need(0 if "prefill" in label else 5 << 20,
                                                   None, "growth"))
                for r in records for label in r.labels]  # fmt: skip

    monkeypatch.setattr(calibrate, "measure_all", measured)
    _, provenance = measure.measure(PLANS, torch.device("cpu"))
    assert provenance["attn.prefill"].startswith(
        "measured here: need 0 bytes (no plan takes any), by growth, for "
    )
    assert provenance["attn.decode"].startswith("measured here: need 5,242,880 bytes, worst decode")
