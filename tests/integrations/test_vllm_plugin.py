"""The vLLM plugin on a CPU: its entry point, the seams it takes in vLLM's source, what it reads
from vLLM's builders, and its wiring of a builder shaped as vLLM's. Its setting:
``test_vllm_setting.py``.

What runs in vLLM itself is proven by ``scripts/vllm_proof.py`` on a GPU (docs/vllm.md): here a
stand-in of vLLM's ``FlashInferMetadataBuilder`` (its lazy ``_get_workspace_buffer()``, its
wrapper getters, its ``fast_plan_decode``, what its ``__init__`` decides) is patched as vLLM's is,
and planned by a fake FlashInfer planner that overflows with FlashInfer's own text.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import subprocess
import sys
import types
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch

from mstar_resources.attn import trtllm_workspace
from mstar_resources.errors import WorkspaceSealedError
from mstar_resources.floor import Floor
from mstar_resources.integrations import vllm as plugin
from mstar_resources.integrations.plugin import patch_module
from mstar_resources.integrations.vllm import plans as vllm_plans
from mstar_resources.integrations.vllm import workspaces
from mstar_resources.integrations.vllm.plans import NATIVE, BuilderPlans, VllmFunctions
from mstar_resources.units import MIB
from tests.attn.fake_allocator import FakePlanner, FakePrefillWrapper, FakeWrapper
from tests.attn.test_trtllm_workspace import tensors as trtllm_launch

ROOT = Path(__file__).parents[2]


# -- the entry point -------------------------------------------------------------------------


def test_the_entry_point_is_registered_for_vllms_general_plugins():
    found = {e.name: e for e in importlib.metadata.entry_points(group="vllm.general_plugins")}
    assert found["mstar_resources"].value == "mstar_resources.integrations.vllm:register"
    assert found["mstar_resources"].load() is plugin.register


def test_without_its_setting_the_plugin_does_nothing_and_imports_no_vllm():
    probe = (
        "import sys; from mstar_resources.integrations import vllm as p; p.register(); "
        "from mstar_resources.integrations import plugin as f; "
        "print(p.active(), [m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')], "
        "f._finder in sys.meta_path)"
    )
    env = {k: v for k, v in os.environ.items() if k != plugin.ENV_VAR}
    for value in (None, "", "  "):
        if value is not None:
            env[plugin.ENV_VAR] = value
        done = subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True,
            cwd=ROOT, timeout=120,
        )  # fmt: skip
        assert done.stdout.split() == ["None", "[]", "False"]


def test_a_worker_in_auto_waits_for_vllm_and_imports_no_hydra():
    """``auto`` composes nothing: what its worker runs (the measurement, the pools) imports no
    Hydra; the plugin's import hook waits for vLLM's modules."""
    probe = (
        "import sys; from mstar_resources.integrations import vllm as p, plugin as f; "
        "f.installed_version = lambda distribution: '0.26.0'; "  # no vLLM installed here
        "p.register(); import mstar_resources.integrations.vllm.workspaces, "
        "mstar_resources.calibration.calibrate, mstar_resources.calibration.measure; "
        "print(f._finder in sys.meta_path, 'hydra' in sys.modules)"
    )
    env = {**os.environ, plugin.ENV_VAR: "auto"}
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True,
        cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert done.stdout.split()[-2:] == ["True", "False"], done.stderr


# -- the seams (every release's: test_plugin.py) ------------------------------------------------


def test_a_module_that_lacks_a_seam_is_left_unpatched(caplog):
    served = workspaces.VllmWorkspaces(workspaces.Setting(plugin.ENV_VAR, "auto"))
    module = types.ModuleType(plugin.BACKEND)
    with caplog.at_level(logging.WARNING, logger=workspaces.logger.name):
        patch_module(served, plugin.SEAMS, module)
    assert "FlashInferMetadataBuilder._get_workspace_buffer" in served.untouched
    assert [r.name for r in caplog.records] == ["vllm.plugins.mstar_resources"]  # under vLLM's


# -- what vLLM's builders will run, read from builders made as vLLM makes them --------------------


@dataclass(frozen=True)
class Spec:
    """vLLM's AttentionSpec in shape: hashable, and copied with another block size."""

    num_kv_heads: int
    head_size: int
    block_size: int
    sliding_window: int | None = None

    def copy_with_new_block_size(self, block_size):
        return replace(self, block_size=block_size)


@dataclass(frozen=True)
class Uniform:
    """vLLM's UniformTypeKVCacheSpecs in shape: one spec per layer."""

    kv_cache_specs: dict
    block_size: int


class Kernel:
    value = "xqa"


class DecidingBuilder:
    """What vLLM's builder ``__init__`` decides, as the stand-in of a GPU: XQA decode wherever
    ``xqa`` is set, FP8 queries in prefill only (SM90)."""

    xqa = False
    reorder_batch_threshold = 1

    def __init__(self, spec, layer_names, heads, kv_cache_dtype="bfloat16"):
        self.spec, self.layer_names = spec, layer_names
        self.num_qo_heads, self.num_kv_heads = heads, spec.num_kv_heads
        self.head_dim, self.page_size = spec.head_size, spec.block_size
        self.cache_dtype = "fp8" if kv_cache_dtype.startswith("float8") else "auto"
        self.kv_cache_dtype = f"torch.{kv_cache_dtype}"
        self.q_data_type_prefill = self.kv_cache_dtype
        self.q_data_type_decode = "torch.bfloat16"
        self.use_trtllm_decode_attention = self.xqa
        self.flashinfer_trtllm_api_decode_kernel = Kernel() if self.xqa else None
        self.dcp_world_size, self.has_sinks = 1, False
        self.enable_cuda_graph, self._decode_cudagraph_max_bs = True, 256
        self.prefill_fixed_split_size = self.decode_fixed_split_size = -1
        self.disable_split_kv = False


class Layer:
    def __init__(self, backend="FLASHINFER", num_heads=32):
        self.num_heads = num_heads
        self._backend = type(backend, (), {"get_name": staticmethod(lambda: backend)})

    def get_attn_backend(self):
        return self._backend


def vllm_config(**attention):
    return types.SimpleNamespace(
        attention_config=types.SimpleNamespace(use_trtllm_attention=None, **attention),
        scheduler_config=types.SimpleNamespace(max_num_batched_tokens=8192, max_num_seqs=256),
        model_config=types.SimpleNamespace(max_model_len=32768, dtype="torch.bfloat16"),
        compilation_config=types.SimpleNamespace(cudagraph_capture_sizes=[1, 2, 4, 8, 256, 512]),
        cache_config=types.SimpleNamespace(),  # before 0.34: no extensible KV cache
    )


def functions(made, kv_cache_dtype="bfloat16", xqa=False, heads=32):
    """vLLM's functions as :func:`plans_of_groups` calls them; ``made`` collects the builders,
    each with ``heads`` query heads (a rank's: vLLM divides them by the tensor-parallel size)."""

    def make_builder(spec, layer_names):
        builder_cls = type("Builder", (DecidingBuilder,), {"xqa": xqa})
        made.append(builder_cls(spec, layer_names, heads=heads, kv_cache_dtype=kv_cache_dtype))
        return made[-1]

    def select_block_size(kv_manager_block_size, backends):
        return max(s for s in (16, 32, 64) if kv_manager_block_size % s == 0)

    def use_trtllm_attention(*args, is_prefill, **kwargs):
        return False  # SM90: never for prefill

    return VllmFunctions(make_builder, select_block_size, use_trtllm_attention, Uniform)


def test_each_kv_cache_group_gets_its_builder_at_the_kernels_block_size():
    """A hybrid model: sliding-window layers and full ones in groups of their own, vLLM's KV
    manager block enlarged to 528 tokens (16 is the kernel's); a group of a Mamba layer alone."""
    sliding, full = Spec(8, 128, 528, sliding_window=4096), Spec(8, 128, 528)
    groups = [
        types.SimpleNamespace(layer_names=["l0", "l2"], kv_cache_spec=sliding),
        types.SimpleNamespace(layer_names=["l1", "l3"], kv_cache_spec=full),
        types.SimpleNamespace(layer_names=["m0"], kv_cache_spec=Spec(0, 0, 528)),
    ]
    layers = {name: Layer() for name in ["l0", "l1", "l2", "l3"]} | {"m0": Layer("MAMBA")}
    made = []
    found = vllm_plans.plans_of_groups(vllm_config(), groups, layers, functions(made))
    assert [(p.group, p.layers, p.page_size) for p in found] == [
        (0, ("l0", "l2"), 16), (1, ("l1", "l3"), 16)
    ]  # fmt: skip
    assert [b.spec for b in made] == [replace(sliding, block_size=16), replace(full, block_size=16)]
    assert (
        found[0].describe()
        == "KV-cache group 0 (2 layers: 32/8 heads of 128, page 16, KV bfloat16)"
    )


def test_a_spec_without_layer_views_keeps_the_managers_block_size():
    """vLLM 0.30+ splits a manager block into kernel blocks only where the spec has layer views;
    without, the kernels plan with the manager's block size."""
    spec = Spec(8, 128, 528)
    unsplit = type("Unsplit", (Spec,), {"has_layer_views": False})(8, 128, 528)
    groups = [types.SimpleNamespace(layer_names=["l0"], kv_cache_spec=s) for s in (spec, unsplit)]
    pages = [
        vllm_plans.plans_of_groups(vllm_config(), [g], {"l0": Layer()}, functions([]))[0].page_size
        for g in groups
    ]
    assert pages == [16, 528]


def test_one_group_of_two_layer_specs_gets_a_builder_for_each():
    """vLLM's UniformTypeKVCacheSpecs: one group, a spec per layer (here two head sizes)."""
    small, large = Spec(8, 64, 16), Spec(8, 256, 16)
    spec = Uniform({"l0": small, "l1": large, "l2": small}, block_size=16)
    groups = [types.SimpleNamespace(layer_names=["l0", "l1", "l2"], kv_cache_spec=spec)]
    layers = {name: Layer() for name in ["l0", "l1", "l2"]}
    found = vllm_plans.plans_of_groups(vllm_config(), groups, layers, functions([]))
    assert [(p.layers, p.head_dim) for p in found] == [(("l0", "l2"), 64), (("l1",), 256)]


def test_the_kernels_and_query_dtypes_are_the_builders_own():
    groups = [types.SimpleNamespace(layer_names=["l0"], kv_cache_spec=Spec(8, 128, 16))]
    native = vllm_plans.plans_of_groups(vllm_config(), groups, {"l0": Layer()}, functions([]))
    (plans,) = native
    assert plans.kernels == {"prefill": NATIVE, "decode": NATIVE}
    assert plans.native("prefill") and plans.native("decode")
    fp8 = functions([], kv_cache_dtype="float8_e4m3fn", xqa=True)
    (plans,) = vllm_plans.plans_of_groups(vllm_config(), groups, {"l0": Layer()}, fp8)
    assert plans.kernels == {"prefill": NATIVE, "decode": "xqa"}
    assert not plans.native("decode")
    assert plans.q_dtypes == {"prefill": "float8_e4m3fn", "decode": "bfloat16"}
    assert plans.kv_dtype == "float8_e4m3fn"
    # A non-causal prefill wrapper is native whatever the causal prefill runs.
    trtllm = replace(plans, kernels={"prefill": "trtllm-gen", "decode": "trtllm-gen"})
    assert not trtllm.native("prefill")
    assert replace(trtllm, non_causal=True).native("prefill")


def test_a_dcp_prefill_on_trtllm_gen_needs_vllms_trtllm_workspace_beside_native_wrappers():
    """vLLM 0.33+: a builder with ``use_trtllm_dcp_prefill`` runs its DCP context on trtllm-gen
    (vLLM's TRT-LLM workspace, which ``fits_workspace`` makes at the first such plan: after KV
    sizing, unless made before) and keeps its native prefill wrappers."""
    groups = [types.SimpleNamespace(layer_names=["l0"], kv_cache_spec=Spec(8, 128, 16))]
    made: list = []
    dcp = functions(made)
    original = dcp.make_builder

    def make_builder(spec, layer_names):
        builder = original(spec, layer_names)
        builder.use_trtllm_dcp_prefill = True
        return builder

    dcp = replace(dcp, make_builder=make_builder)
    (plans,) = vllm_plans.plans_of_groups(vllm_config(), groups, {"l0": Layer()}, dcp)
    assert plans.trtllm_dcp_prefill and plans.native("prefill")
    assert [(role, kernel) for _, role, kernel in vllm_plans.trtllm_kernels([plans])] == [
        ("prefill", "trtllm-gen (DCP context)")
    ]
    assert list(vllm_plans.trtllm_kernels([PLANS])) == []


def test_auto_leaves_an_nvfp4_kv_cache_on_native_wrappers_as_vllm_makes_it():
    """vLLM 0.32+ plans an NVFP4 KV cache on FlashInfer's native wrappers as uint8 pages, which
    no calibration profile holds."""
    nvfp4 = replace(PLANS, kv_dtype="uint8")
    reason = vllm_plans.unmeasured_kv([PLANS, nvfp4])
    assert reason is not None and "NVFP4" in reason and "page 16, KV uint8" in reason
    assert vllm_plans.unmeasured_kv([PLANS]) is None
    on_xqa = replace(nvfp4, kernels={"prefill": "trtllm-gen", "decode": "trtllm-gen"})
    assert vllm_plans.unmeasured_kv([on_xqa]) is None  # no native wrapper plans it


PLANS = BuilderPlans(
    group=0, layers=("l0",), num_qo_heads=32, num_kv_heads=8, head_dim=128, page_size=16,
    kv_dtype="bfloat16", q_dtypes={"prefill": "bfloat16", "decode": "bfloat16"},
    o_dtype="bfloat16", kernels={"prefill": NATIVE, "decode": NATIVE}, decode_graph_max_batch=256,
)  # fmt: skip


def profile_for(plans, role, config):
    """The one profile of ``plans``' ``role`` plans."""
    ((_, _, profile),) = vllm_plans.builder_profiles([plans], [role], config)
    return profile


def measuring(need):
    """A stand-in ``measured_needs``: ``need(profile, role, graphs, device)`` for each profile."""
    return lambda profiles, device: [
        need(profile, role, plans.graphs(role), device) for role, plans, profile in profiles
    ]


def test_a_builders_profile_is_planned_with_its_own_shape(monkeypatch):
    monkeypatch.setattr(vllm_plans, "vllm_envs", lambda: types.SimpleNamespace(
        VLLM_BATCH_INVARIANT=False))  # fmt: skip
    fp8 = replace(PLANS, kv_dtype="float8_e4m3fn",
                  q_dtypes={"prefill": "float8_e4m3fn", "decode": "bfloat16"})  # fmt: skip
    decode = profile_for(fp8, "decode", vllm_config())
    assert (decode.model.q_dtype, decode.model.kv_dtype) == ("bfloat16", "float8_e4m3fn")
    # An FP8 query writes the model's dtype, as vLLM plans it (fa2 and fa3 write no FP8).
    prefill = profile_for(fp8, "prefill", vllm_config())
    assert (prefill.model.q_dtype, prefill.model.o_dtype) == ("float8_e4m3fn", "bfloat16")
    assert decode.cuda_graph_batch_sizes == [1, 2, 4, 8, 256]  # up to the builder's 256
    # DCP: decode plans every DCP rank's query heads together.
    dcp = profile_for(replace(PLANS, dcp_world_size=4), "decode", vllm_config())
    assert dcp.model.num_qo_heads == 128
    # Speculative tokens decoded as decode (vLLM 0.33's fa2): 1 + 3 query tokens a request.
    spec = profile_for(replace(PLANS, decode_q_len=4), "decode", vllm_config())
    assert spec.plans["decode"].q_len_per_req == 4
    assert spec.cuda_graph_batch_sizes == [1, 2, 64]  # 4, 8 and 256 tokens: 1, 2, 64 requests
    eager = profile_for(replace(PLANS, decode_graph_max_batch=None), "decode",
                                   vllm_config())  # fmt: skip
    assert eager.cuda_graph_batch_sizes == [1]


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
        self.vllm_config = vllm_config()  # 0.26-0.33's: no extensible KV cache
        self.device = torch.device("cpu")
        self.profiled = self.captured = 0
        self.in_capture: list[object] = []
        """What runs inside ``capture_model``, after vLLM's own capture: 0.34's adaptive
        verification (callables)."""

    def profile_run(self):
        self.profiled += 1

    def capture_model(self, **kwargs):
        """As vLLM's: nothing where ``cudagraph_mode`` is NONE, else counted, captured, locked."""
        self.captured += 1
        if getattr(self, "cudagraph_mode_none", False):
            return 0
        sys.modules[type(self).__module__].compilation_counter.num_gpu_runner_capture_triggers += 1
        for step in self.in_capture:
            step()

    def profile_cudagraph_memory(self):
        """V2's measure of its graphs' memory, after the profile: 0.29 captures them bare."""
        return self.capture_model() if getattr(self, "captures_to_profile", False) else 0

    def get_kv_cache_spec(self):
        return {}


class StandInWorker:
    def __init__(self, runner) -> None:
        self.model_runner = runner

    def compile_or_warm_up_model(self):
        """As vLLM's: capture where graphs are on (``enforce_eager`` off)."""
        if not getattr(self, "eager", False):
            self.model_runner.capture_model()
        return "times"


backend = types.ModuleType(plugin.BACKEND)
TRTLLM = torch.zeros(4 * MIB, dtype=torch.uint8)
"""vLLM's TRT-LLM workspace, as its ``_get_trtllm_workspace_buffer()`` would make it."""
H200_SMS = 132


@pytest.fixture
def vllm_stand_in(monkeypatch):
    """Fresh stand-in modules of vLLM's, patched by a plugin enabled for the shipped Llama 8B
    deployment with floors of 2 MB (prefill) and 4 MB (decode); one builder, both phases on
    FlashInfer's native wrappers (``plans`` in the returned namespace changes that)."""
    global backend
    backend = types.ModuleType(plugin.BACKEND)
    backend.FlashInferMetadataBuilder = type("FlashInferMetadataBuilder", (StandInBuilder,), {})
    backend.fast_plan_decode = lambda wrapper, *args, **kwargs: wrapper.plan(*args, **kwargs)
    backend._get_trtllm_workspace_buffer = lambda: TRTLLM
    launched: list[tuple[str, dict]] = []  # the kernels' launches that reached FlashInfer

    def launcher(entry):
        return lambda **kwargs: launched.append((entry, kwargs))

    backend.trtllm_batch_decode_with_kv_cache = launcher("trtllm")
    backend.flashinfer_xqa_batch_decode_with_kv_cache = launcher("xqa")
    backend.FLASHINFER_PREFILL_WORKSPACE_BYTES_PER_ELEM = 16
    backend.FLASHINFER_WORKSPACE_BUFFER_SIZE_BATCH_INVARIANT = 2 << 30
    runner = types.ModuleType(vllm_plans.V2_RUNNER)
    runner.GPUModelRunner = type(
        "GPUModelRunner", (StandInRunner,), {"__module__": runner.__name__}
    )
    runner.compilation_counter = types.SimpleNamespace(num_gpu_runner_capture_triggers=0)
    monkeypatch.setitem(sys.modules, runner.__name__, runner)
    worker = types.ModuleType(plugin.WORKER)
    worker.Worker = type("Worker", (StandInWorker,), {})
    state = types.SimpleNamespace(plans=[PLANS], launched=launched)
    monkeypatch.setattr(vllm_plans, "uncovered_attention", lambda config: None)
    monkeypatch.setattr(vllm_plans, "builder_plans", lambda runner: state.plans)
    monkeypatch.setattr(vllm_plans, "vllm_buffer_bytes", lambda config, plans: (VLLM_BYTES, "-"))
    sms = types.SimpleNamespace(multi_processor_count=H200_SMS)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: sms)
    setting = plugin.VLLM.read({plugin.ENV_VAR: "llama3-8b-h200"})  # 256 / 128 MB: lowered
    records = tuple(
        replace(r, declared_mb=mb, floor=replace(r.floor, mb=mb))
        for r, mb in zip(setting.records, (2, 4), strict=True)
    )  # fmt: skip
    monkeypatch.setenv(plugin.ENV_VAR, setting.value)  # as vLLM loaded the plugin
    served = workspaces.VllmWorkspaces(workspaces.Setting(plugin.ENV_VAR, setting.value, records))
    patch_module(served, plugin.SEAMS, backend)
    patch_module(served, plugin.SEAMS, runner)
    patch_module(served, plugin.SEAMS, worker)
    made_runner = runner.GPUModelRunner()
    state.served, state.Builder, state.runner = (
        served,
        backend.FlashInferMetadataBuilder,
        made_runner,
    )
    state.worker = worker.Worker(made_runner)
    return state


def test_the_profile_reserves_both_workspaces_and_vllms_buffer_is_never_made(vllm_stand_in):
    served, Builder, runner = vllm_stand_in.served, vllm_stand_in.Builder, vllm_stand_in.runner
    runner.profile_run()
    assert runner.profiled == 1
    assert served.held_bytes == 6 * MIB and served.trtllm_bytes == 0
    builders = [Builder(), Builder()]  # V1: one builder per attention group
    for builder in builders:
        builder._get_workspace_buffer()  # V2's runner asks the first builder for its buffer
    prefill = builders[0]._get_prefill_wrapper()
    decodes = [builders[1]._get_decode_wrapper(b, True) for b in (1, 8, 64)]
    pools = served.pools
    assert prefill._float_workspace_buffer is pools["attn.prefill"].get("prefill").tensor
    assert all(d.buffer is pools["attn.decode"].get("decode", 0).tensor for d in decodes)
    assert all(b._workspace_buffer is None for b in builders)
    assert served.report()["builders"] == 2


def test_where_xqa_decodes_its_workspace_is_the_bound_of_what_xqa_touches_zeroed_and_sealed(
    vllm_stand_in, caplog
):
    """No native decode workspace; vLLM's TRT-LLM workspace, made before vLLM sizes its KV
    cache, at the bound of what XQA touches for these heads, vLLM's largest batch and any page
    table on this GPU's SMs, in place of vLLM's buffer; zeroed, and sealed with the others."""
    xqa = replace(PLANS, kernels={"prefill": NATIVE, "decode": "xqa"})
    vllm_stand_in.plans = [xqa]
    served, runner = vllm_stand_in.served, vllm_stand_in.runner
    with caplog.at_level(logging.INFO, logger=workspaces.logger.name):
        runner.profile_run()
    assert list(served.pools) == ["attn.prefill"]
    assert served.held_bytes == 2 * MIB
    bound = trtllm_workspace.xqa_workspace_bytes(
        batch=256, num_qo_heads=32, num_kv_heads=8, head_dim=128,
        max_seq_len=H200_SMS * trtllm_workspace.XQA_MHA_TILE_TOKENS, sm_count=H200_SMS,
    )  # fmt: skip
    assert served.trtllm_bytes == bound < 9 * MIB
    held = backend._get_trtllm_workspace_buffer()  # vLLM's function, as its kernels call it
    assert held is served.trtllm_workspace.tensor and held is not TRTLLM
    assert held.numel() == bound and not held.any()
    report = served.report()
    assert report["native_roles"] == ["prefill"]
    assert report["trtllm_workspace_bytes"] == bound
    assert report["provenance"]["attn.trtllm"].startswith("the bound of what the kernels touch")
    text = caplog.text
    assert "decode on xqa" in text and "no decode workspace" in text
    assert f"attn.trtllm: {bound:,} bytes for vLLM's TRT-LLM kernels, zeroed" in text
    # A native decode wrapper vLLM builds all the same takes vLLM's own buffer, with a warning.
    builder = vllm_stand_in.Builder()
    with caplog.at_level(logging.WARNING, logger=workspaces.logger.name):
        decode = builder._get_decode_wrapper(8, True)
    assert decode.buffer is builder._workspace_buffer
    assert report["unexpected_wrappers"] == [] and served.unexpected == ["decode"]
    assert "though its builders run decode on xqa" in caplog.text
    vllm_stand_in.worker.compile_or_warm_up_model()
    assert served.sealed and served.trtllm_workspace.sealed


def test_trtllm_gens_bound_holds_a_dcp_decodes_softmax_stats_and_0_6_14s_counters(monkeypatch):
    """trtllm-gen (SM100, both phases) cannot run on an H200: its bound is checked here on the
    arithmetic. A DCP decode returns LSE, whose stats (all DCP ranks' heads) come first; FlashInfer
    0.6.14 keeps 8 MiB of counters at the head, later releases a buffer apart; a DCP context run
    checks its own fit (vLLM's ``fits_workspace``) and is given vLLM's size."""
    gen = replace(PLANS, kernels={"prefill": "trtllm-gen", "decode": "trtllm-gen"})
    config = vllm_config()
    plain, _ = vllm_plans.trtllm_workspace_bound([gen], config, 148, "0.7.4")
    scratch = 148 * trtllm_workspace.TRTLLM_GEN_MAX_STEP_Q * (8 + 2 * 128)
    assert plain == scratch
    older, how = vllm_plans.trtllm_workspace_bound([gen], config, 148, "0.6.14")
    assert older == scratch + 8 * MIB and "FlashInfer 0.6.14" in how
    dcp, _ = vllm_plans.trtllm_workspace_bound(
        [replace(gen, dcp_world_size=2)], config, 148, "0.7.4"
    )
    stats = 32 * 2 * 256 * 256 * 8 + MIB  # heads x DCP ranks x max_num_seqs x one 256-row tile
    assert dcp == stats + scratch
    context = replace(PLANS, dcp_world_size=2, trtllm_dcp_prefill=True)
    envs = types.SimpleNamespace(VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE=394 * MIB)
    monkeypatch.setattr(vllm_plans, "vllm_envs", lambda: envs)
    own, _ = vllm_plans.trtllm_workspace_bound([context], config, 148, "0.7.4")
    assert own == 394 * MIB


SPEC_AS_DECODE = {
    "0.26.0": {"trtllm-gen"},
    "0.28.0": {"trtllm-gen"},  # and XQA on SM120 (use_dedicated_xqa)
    "0.30.0": {"trtllm-gen", "xqa"},
    "0.34.0": {"trtllm-gen", "xqa"},  # and fa2 native decode, off on SM90
}
"""The decode kernels each release's builder counts speculative tokens as decode for on Hopper
(``supports_spec_as_decode``, read in its wheel)."""


def threshold(release: str, kernel: str, drafts: int, parallel: bool = False) -> int:
    """vLLM's ``reorder_batch_threshold`` as that release's builder sets it on Hopper."""
    if kernel not in SPEC_AS_DECODE[release]:
        return 1  # speculative tokens go to prefill (0.26's XQA refuses them outright)
    return 1 + (2 if parallel else 1) * drafts


@pytest.mark.parametrize(
    ("release", "parallel", "q_len", "bound"),
    [
        ("0.26.0", False, 1, 8_552_448),
        ("0.28.0", False, 1, 8_552_448),
        ("0.30.0", False, 3, 9_469_952),
        ("0.34.0", False, 3, 9_469_952),
        ("0.34.0", True, 5, 9_469_952),
    ],
)
def test_the_xqa_bound_covers_the_query_length_each_releases_builder_decodes(
    release, parallel, q_len, bound
):
    made: list = []
    vllm = functions(made, xqa=True)
    spec = Spec(num_kv_heads=8, head_size=128, block_size=16)
    builder = vllm.make_builder(spec, ["l0"])
    builder.reorder_batch_threshold = threshold(release, "xqa", drafts=2, parallel=parallel)
    plans = vllm_plans.read_builder(builder, 0, ["l0"], vllm_config(), vllm)
    assert plans.kernels["decode"] == "xqa" and plans.decode_q_len == q_len
    need, _ = vllm_plans.trtllm_workspace_bound([plans], vllm_config(), H200_SMS, "0.7.4")
    assert need == bound == trtllm_workspace.xqa_workspace_bytes(
        batch=256, num_qo_heads=32, num_kv_heads=8, head_dim=128,
        max_seq_len=H200_SMS * trtllm_workspace.XQA_MHA_TILE_TOKENS, sm_count=H200_SMS,
        q_len_per_req=q_len,
    )  # fmt: skip
    fp8 = replace(plans, kv_dtype="float8_e4m3fn")
    fp8_need, _ = vllm_plans.trtllm_workspace_bound([fp8], vllm_config(), H200_SMS, "0.7.4")
    assert fp8_need == (10_551_296 if q_len > 1 else 8_552_448)


def launch(q_len: int, batch: int = 1, **kwargs):
    """A decode launch's arguments as vLLM's backend passes them, on the TRT-LLM workspace."""
    return {
        **trtllm_launch(batch=batch, q_len=q_len, table_tokens=32768),
        "workspace_buffer": backend._get_trtllm_workspace_buffer(),
        **kwargs,
    }


def test_each_trtllm_launch_is_checked_before_it_reaches_flashinfer(vllm_stand_in):
    """0.30+: speculative tokens decoded on XQA through its own entry point; 0.26: XQA one token a
    request through trtllm_batch_decode_with_kv_cache(backend="xqa"). A launch the bound covers
    reaches FlashInfer; one past the workspace (the one-token bound planted where drafts decode)
    is refused before the kernel runs, naming the setting, and FlashInfer never sees it."""
    xqa = replace(PLANS, kernels={"prefill": NATIVE, "decode": "xqa"}, decode_q_len=3)
    vllm_stand_in.plans = [xqa]
    served = vllm_stand_in.served
    vllm_stand_in.runner.profile_run()
    assert served.trtllm_bytes == 9_469_952
    backend.flashinfer_xqa_batch_decode_with_kv_cache(**launch(3))
    backend.flashinfer_xqa_batch_decode_with_kv_cache(**launch(2, batch=4))
    backend.trtllm_batch_decode_with_kv_cache(**launch(1, backend="xqa"))
    assert [entry for entry, _ in vllm_stand_in.launched] == ["xqa", "xqa", "trtllm"]
    vllm_stand_in.worker.compile_or_warm_up_model()  # sealed: the launches are checked the same

    # The next engine planted with the bound of one token a request, as the plugin once sized it.
    vllm_stand_in.plans = [replace(xqa, decode_q_len=1)]
    next_engine = type(vllm_stand_in.runner)()
    next_engine.profile_run()
    assert served.trtllm_bytes == 8_552_448
    with pytest.raises(WorkspaceSealedError) as refused:
        backend.flashinfer_xqa_batch_decode_with_kv_cache(**launch(3))
    assert refused.value.setting == "resources.attn.trtllm.declared_mb"
    assert refused.value.needed_bytes == 9_469_952 and refused.value.suggested_mb == 10
    assert len(vllm_stand_in.launched) == 3  # the refused launch never reached FlashInfer
    report = served.report()
    assert (report["trtllm_launches_checked"], report["trtllm_launches_refused"]) == (1, 1)


def test_a_release_not_read_keeps_vllms_trtllm_workspace_and_serves_the_native_ones(
    vllm_stand_in, caplog
):
    vllm_stand_in.plans = [replace(PLANS, kernels={"prefill": NATIVE, "decode": "xqa"})]
    served = vllm_stand_in.served
    served.unread_release = "0.35.0"
    with caplog.at_level(logging.INFO, logger=workspaces.logger.name):
        vllm_stand_in.runner.profile_run()
    assert served.held_bytes == 2 * MIB and served.trtllm_bytes == 0
    assert backend._get_trtllm_workspace_buffer() is TRTLLM
    assert served.trtllm_check is None  # vLLM's own buffer: its launches are vLLM's as they are
    backend.flashinfer_xqa_batch_decode_with_kv_cache(**launch(3))
    assert len(vllm_stand_in.launched) == 1
    assert "vLLM 0.35.0 is not a release this plugin was read in" in caplog.text
    assert "vLLM keeps its own (VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE)" in caplog.text


def test_an_elastic_ep_scale_up_launch_says_the_plugin_reserves_nothing(monkeypatch, caplog):
    """vLLM 0.34 skips its memory profile (where the plugin reserves) in such a launch."""
    monkeypatch.setenv(workspaces.SCALE_UP_LAUNCH, "1")
    with caplog.at_level(logging.WARNING, logger=workspaces.logger.name):
        served = workspaces.VllmWorkspaces(plugin.VLLM.read({plugin.ENV_VAR: "auto"}))
    assert served.untouched is not None and workspaces.SCALE_UP_LAUNCH in served.untouched
    assert "vLLM keeps its own FlashInfer workspace" in caplog.text
    monkeypatch.setenv(workspaces.SCALE_UP_LAUNCH, "0")
    assert workspaces.VllmWorkspaces(plugin.VLLM.read({plugin.ENV_VAR: "auto"})).untouched is None


def test_an_unplanned_wrapper_on_v2s_shared_buffer_is_said_to_plan_on_the_plugins_workspace(
    vllm_stand_in, caplog
):
    """vLLM's V2 runner (0.30+) hands the first builder's buffer, the plugin's first workspace, to
    every other builder as its own: a native decode wrapper no builder planned is built on it."""
    vllm_stand_in.plans = [replace(PLANS, kernels={"prefill": NATIVE, "decode": "xqa"})]
    vllm_stand_in.runner.profile_run()
    first, other = vllm_stand_in.Builder(), vllm_stand_in.Builder()
    shared = first._get_workspace_buffer()  # as V2's attn_utils asks it, no wrapper being built
    other._workspace_buffer = shared  # other.set_workspace_buffer(shared)
    with caplog.at_level(logging.WARNING, logger=workspaces.logger.name):
        decode = other._get_decode_wrapper(8, True)
    assert (
        decode.buffer is shared is vllm_stand_in.served.pools["attn.prefill"].get("prefill").tensor
    )
    assert "it plans on the plugin's attention:prefill workspace" in caplog.text


def test_where_trtllm_gen_runs_both_phases_only_its_workspace_is_made_and_sealed(vllm_stand_in):
    """Blackwell: trtllm-gen prefills and decodes, so no native workspace; the V2 runner's ask for
    the first builder's buffer (to hand to the others) gets vLLM's own, as vLLM makes it."""
    gen = replace(PLANS, kernels={"prefill": "trtllm-gen", "decode": "trtllm-gen"})
    vllm_stand_in.plans = [gen]
    served, runner = vllm_stand_in.served, vllm_stand_in.runner
    runner.profile_run()
    assert served.pools == {} and served.held_bytes == 0
    # no FlashInfer here, so its version is unknown and 0.6.14's 8 MiB of counters are counted
    scratch = H200_SMS * trtllm_workspace.TRTLLM_GEN_MAX_STEP_Q * (8 + 2 * 128)
    assert served.trtllm_bytes == 8 * MIB + scratch and served.serving
    builder = vllm_stand_in.Builder()
    assert builder._get_workspace_buffer() is builder._workspace_buffer  # vLLM's own
    vllm_stand_in.worker.compile_or_warm_up_model()
    assert served.sealed and served.trtllm_workspace.sealed


@pytest.mark.parametrize(("declared_mb", "wins"), [(64, "declared"), (1, "bound")])
def test_a_deployments_trtllm_floor_is_kept_where_it_is_above_the_bound(
    vllm_stand_in, declared_mb, wins
):
    from mstar_resources.resolver import resolve

    served = vllm_stand_in.served
    trtllm = resolve({"attn": {"trtllm": {"owner": "attention", "labels": ["trtllm"],
                                          "declared_mb": declared_mb}}}, env={})  # fmt: skip
    served.setting = replace(served.setting, records=(*served.setting.records, *trtllm))
    vllm_stand_in.plans = [replace(PLANS, kernels={"prefill": NATIVE, "decode": "xqa"})]
    vllm_stand_in.runner.profile_run()
    provenance = served.report()["provenance"]["attn.trtllm"]
    if wins == "declared":
        assert served.trtllm_bytes == 64 * MIB
        assert provenance.startswith("resources.attn.trtllm.declared_mb (64 MB), above the bound")
    else:
        assert MIB < served.trtllm_bytes < 9 * MIB
        assert provenance.startswith("the bound")


def test_a_model_of_several_groups_is_sized_for_the_most_any_builder_needs(
    vllm_stand_in, monkeypatch
):
    """``auto``: each builder's plans measured (once for builders alike), the floor the largest,
    and the log names the group that set it. The decode wrappers' int workspace holds the most
    any builder's decode plans need of it; vLLM's prefill wrappers keep their own, so the
    prefill workspace has none."""
    from mstar_resources.calibration.calibrate import Measured

    wide = replace(PLANS, group=1, layers=("l1",), num_qo_heads=64, num_kv_heads=4)
    vllm_stand_in.plans = [PLANS, replace(PLANS, layers=("l2",)), wide]
    measured = []

    def need(profile, role, graphs, device):
        measured.append((role, profile.model.num_qo_heads, graphs))
        heads = profile.model.num_qo_heads
        int_need = heads * 40_000  # 64 heads: 2,560,000 bytes, held in 3 MiB
        return Measured(f"attn.{role}", heads * MIB, f"{role}: bs={heads}", "query", int_need)

    monkeypatch.setattr(workspaces, "measured_needs", measuring(need))
    monkeypatch.setattr(vllm_plans, "vllm_envs", lambda: types.SimpleNamespace(
        VLLM_BATCH_INVARIANT=False))  # fmt: skip
    served = workspaces.VllmWorkspaces(workspaces.Setting(plugin.ENV_VAR, "auto"))
    runner = types.SimpleNamespace(vllm_config=vllm_config(), device=torch.device("cpu"))
    served.reserve(runner)
    assert sorted(measured) == [("decode", 32, True), ("decode", 64, True),
                                ("prefill", 32, False), ("prefill", 64, False)]  # fmt: skip
    decode = served.pools["attn.decode"].get("decode", 0)
    assert decode.tensor.numel() == 64 * MIB
    assert decode.int_workspace is not None and decode.int_workspace.tensor.numel() == 3 * MIB
    assert served.pools["attn.prefill"].get("prefill").int_workspace is None
    assert served.provenance["attn.decode"].endswith(
        "for KV-cache group 1 (1 layer: 64/4 heads of 128, page 16, KV bfloat16), the most of 2 "
        "builders, int need 2,560,000 bytes"
    )
    assert served.provenance["attn.prefill"].endswith("no int workspace")


def test_each_tensor_parallel_rank_measures_its_own_heads_and_the_ranks_agree(monkeypatch):
    """Tensor parallel 2 of Llama 3 8B's attention (32 query, 8 KV heads): vLLM's worker on each
    rank makes its builders with 16 and 4 (its KV-cache spec holds the rank's KV heads), and the
    plugin's ``auto``, in each worker process, measures the plans of those; the two ranks, alike,
    reserve the same bytes, so vLLM's cut of every worker's KV blocks to the smallest takes
    nothing more from either."""
    from mstar_resources.calibration.calibrate import Measured

    monkeypatch.setattr(vllm_plans, "vllm_envs", lambda: types.SimpleNamespace(
        VLLM_BATCH_INVARIANT=False))  # fmt: skip
    monkeypatch.setattr(vllm_plans, "uncovered_attention", lambda config: None)
    monkeypatch.setattr(vllm_plans, "vllm_buffer_bytes", lambda config, plans: (VLLM_BYTES, "-"))
    measured = []

    def need(profile, role, graphs, device):
        model = profile.model
        measured.append((role, model.num_qo_heads, model.num_kv_heads))
        return Measured(f"attn.{role}", model.num_qo_heads * MIB, f"{role}: bs=1", "query")

    monkeypatch.setattr(workspaces, "measured_needs", measuring(need))
    groups = [types.SimpleNamespace(layer_names=["l0", "l1"], kv_cache_spec=Spec(4, 128, 16))]
    layers = {name: Layer(num_heads=16) for name in ["l0", "l1"]}
    ranks = []
    for _rank in range(2):  # each worker is a process of its own: a plugin state each
        plans = vllm_plans.plans_of_groups(vllm_config(), groups, layers, functions([], heads=16))
        monkeypatch.setattr(vllm_plans, "builder_plans", lambda runner, plans=plans: plans)
        served = workspaces.VllmWorkspaces(workspaces.Setting(plugin.ENV_VAR, "auto"))
        served.reserve(types.SimpleNamespace(vllm_config=vllm_config(), device=torch.device("cpu")))
        ranks.append(served)
    assert measured == [("prefill", 16, 4), ("decode", 16, 4)] * 2
    assert [r.reading.plans[0].describe() for r in ranks] == [
        "KV-cache group 0 (2 layers: 16/4 heads of 128, page 16, KV bfloat16)"
    ] * 2
    assert ranks[0].held_bytes == ranks[1].held_bytes == 2 * 16 * MIB  # prefill, decode
    # No int need measured: no int workspace reserved, the wrappers keep their own.
    assert ranks[0].pools["attn.decode"].get("decode", 0).int_workspace is None
    assert ranks[0].report()["workspaces"] == ranks[1].report()["workspaces"]
    assert "16/4 heads of 128" in ranks[1].provenance["attn.decode"]


def test_a_phase_whose_plans_take_no_float_workspace_is_said_so_and_held_at_one_mb(
    vllm_stand_in, monkeypatch
):
    """FlashInfer's FA3 prefill (vLLM 0.34's FP8 query on SM90) plans no float workspace: the
    measured need is 0, which the log says as such (no shape named), and the floor is 1 MB."""
    from mstar_resources.calibration.calibrate import Measured

    def need(profile, role, graphs, device):
        worst = "prefill: -" if role == "prefill" else "decode: bs=8"
        return Measured(f"attn.{role}", 0 if role == "prefill" else MIB, worst, "growth")

    monkeypatch.setattr(workspaces, "measured_needs", measuring(need))
    monkeypatch.setattr(vllm_plans, "vllm_envs", lambda: types.SimpleNamespace(
        VLLM_BATCH_INVARIANT=False))  # fmt: skip
    served = workspaces.VllmWorkspaces(workspaces.Setting(plugin.ENV_VAR, "auto"))
    served.reserve(types.SimpleNamespace(vllm_config=vllm_config(), device=torch.device("cpu")))
    assert served.pools["attn.prefill"].get("prefill").tensor.numel() == MIB
    assert served.provenance["attn.prefill"].startswith(
        "measured here (MSTAR_RESOURCES_VLLM=auto): need 0 bytes (no plan takes any), by growth, "
        "for KV-cache group 0"
    )
    assert "need 1,048,576 bytes, worst decode: bs=8, by growth" in served.provenance["attn.decode"]


def test_a_plan_before_the_seal_grows_its_workspace_in_place(vllm_stand_in):
    served, runner = vllm_stand_in.served, vllm_stand_in.runner
    runner.profile_run()
    builder = vllm_stand_in.Builder()
    builder.build(8)
    decode = served.pools["attn.decode"].get("decode", 0)
    prefill = served.pools["attn.prefill"].get("prefill")
    assert decode.tensor.numel() == 6 * MIB  # 5 + 1 MiB, from a floor of 4
    assert prefill.tensor.numel() == 3 * MIB  # from a floor of 2
    assert builder._get_prefill_wrapper()._workspace_size == 3 * MIB
    assert served.report()["growths"] == 3  # decode: tmp_v, then tmp_s; prefill: once


def test_capture_seals_and_a_plan_that_no_longer_fits_names_the_setting(vllm_stand_in):
    served, runner = vllm_stand_in.served, vllm_stand_in.runner
    runner.profile_run()
    builder = vllm_stand_in.Builder()
    builder.build(8)
    runner.capture_model(profile_only=True)  # 0.33's measuring capture: nothing sealed yet
    assert not served.sealed
    vllm_stand_in.worker.compile_or_warm_up_model()  # captures, then serves
    assert served.sealed and runner.captured == 2
    assert served.sealed_before == "captures CUDA graphs"
    decode = served.pools["attn.decode"].get("decode", 0)
    address = decode.tensor.data_ptr()
    builder.decode_chain = [("batch_decode_tmp_v", 9 * MIB, 16)]
    with pytest.raises(WorkspaceSealedError) as raised:
        builder.build(16)
    assert raised.value.setting == "resources.attn.decode.declared_mb"
    assert raised.value.suggested_mb == 9
    assert decode.tensor.data_ptr() == address and decode.tensor.numel() == 6 * MIB
    assert served.report()["sealed_overflows"] == 1


def test_a_builder_made_with_pages_not_planned_is_said_once(vllm_stand_in, caplog):
    vllm_stand_in.runner.profile_run()
    odd = vllm_stand_in.Builder()
    odd.page_size = 64
    with caplog.at_level(logging.WARNING, logger=workspaces.logger.name):
        odd._get_decode_wrapper(8, True)
        odd._get_prefill_wrapper()
        vllm_stand_in.Builder()._get_decode_wrapper(8, True)
    assert caplog.text.count("with pages of 64 tokens, where the plugin planned 16") == 1


def test_vllm_034s_worker_order_reserves_at_the_profile_and_seals_before_capture(
    vllm_stand_in, caplog
):
    """vLLM 0.34 with its extensible KV cache (on by default on CUDA): the profile, then the
    builders (V2 hands the first one's buffer to the others), warm-ups that plan (a growth is
    still allowed), the capture (sealed first), adaptive verification inside the capture and the
    sampler's warm-up after it (both planning on the sealed workspaces), then the KV cache sized
    from the memory then free: vLLM's own buffer would be counted there too, and the plugin
    says so."""
    served, runner = vllm_stand_in.served, vllm_stand_in.runner
    runner.vllm_config.cache_config.enable_extensible_kv_cache = True
    with caplog.at_level(logging.INFO, logger=workspaces.logger.name):
        runner.profile_run()  # determine_available_memory
    assert served.held_bytes == 6 * MIB
    first, second = vllm_stand_in.Builder(), vllm_stand_in.Builder()  # initialize_kv_cache
    second._workspace_buffer = first._get_workspace_buffer()  # set_workspace_buffer
    first.build(8)  # warm-ups: kernel_warmup, warmup_kernels, the KV-sizing warm-up
    decode = served.pools["attn.decode"].get("decode", 0)
    assert decode.tensor.numel() == 6 * MIB and not served.sealed  # grown before the seal
    sealed_at_capture = []
    runner.in_capture = [lambda: sealed_at_capture.append(served.sealed), lambda: second.build(8)]
    vllm_stand_in.worker.compile_or_warm_up_model()  # capture, verification inside it
    first.build(8)  # the sampler's warm-up, after the capture
    assert sealed_at_capture == [True] and served.sealed_before == "captures CUDA graphs"
    report = served.report()
    assert report["growths"] == 3 and report["sealed_overflows"] == 0
    assert report["kv_cache_sized"].startswith("after graph capture")
    assert report["vllm_bytes_outside_budget"] == 0
    assert "before it sizes its extensible KV cache after graph capture" in caplog.text
    assert "outside its budget" not in caplog.text
    second.decode_chain = [("batch_decode_tmp_v", 9 * MIB, 16)]  # verification past the floor
    with pytest.raises(WorkspaceSealedError) as raised:
        second.build(16)
    assert raised.value.setting == "resources.attn.decode.declared_mb"


def test_at_the_profile_vllms_v2_buffer_is_said_outside_its_budget(
    vllm_stand_in, caplog, monkeypatch
):
    """Before 0.34 (or with the extensible KV cache off), the V2 runner makes its buffer after
    it sizes the KV cache at the profile: the plugin's report counts it outside the budget."""
    served, runner = vllm_stand_in.served, vllm_stand_in.runner
    monkeypatch.setattr(type(runner), "__module__", vllm_plans.V2_RUNNER)
    with caplog.at_level(logging.INFO, logger=workspaces.logger.name):
        runner.profile_run()
    report = served.report()
    assert report["kv_cache_sized"] == "at the memory profile"
    assert report["vllm_bytes_outside_budget"] == VLLM_BYTES
    assert "after it sizes its KV cache: outside its budget" in caplog.text


def test_without_graph_capture_the_workspaces_are_sealed_before_the_first_request(vllm_stand_in):
    """``enforce_eager``: vLLM never calls ``capture_model``; its warm-up ends sealed."""
    served, runner = vllm_stand_in.served, vllm_stand_in.runner
    runner.profile_run()
    vllm_stand_in.Builder().build(8)  # vLLM's warm-up plans
    worker = vllm_stand_in.worker
    worker.eager = True
    assert worker.compile_or_warm_up_model() == "times"
    assert runner.captured == 0
    assert served.sealed
    assert served.sealed_before == "serves its first request (it captured no CUDA graph)"


def test_a_model_the_plugin_does_not_serve_keeps_vllms_buffer(vllm_stand_in, monkeypatch, caplog):
    served, runner = vllm_stand_in.served, vllm_stand_in.runner
    monkeypatch.setattr(vllm_plans, "uncovered_attention", lambda c: "its attention is FLASH_ATTN")
    with caplog.at_level(logging.WARNING, logger=workspaces.logger.name):
        runner.profile_run()
        builder = vllm_stand_in.Builder()
        builder.build(8)
    assert builder._workspace_buffer is not None
    assert builder._get_prefill_wrapper()._float_workspace_buffer is builder._workspace_buffer
    assert served.pools == {} and "FLASH_ATTN" in served.untouched
    assert [r.levelno for r in caplog.records] == [logging.WARNING]


def test_a_failure_of_the_plugins_own_leaves_vllm_as_it_is(vllm_stand_in, monkeypatch):
    """vLLM's own refusal in its builder (sliding windows on SM90, say) reaches the plugin first,
    at the profile: the plugin leaves vLLM as it is, and vLLM then refuses in its own words."""
    served, runner = vllm_stand_in.served, vllm_stand_in.runner

    def refused(runner):
        raise NotImplementedError(
            "FlashInfer backend on SM90 currently crashes with sliding-window"
        )

    monkeypatch.setattr(vllm_plans, "builder_plans", refused)
    runner.profile_run()
    vllm_stand_in.worker.compile_or_warm_up_model()
    builder = vllm_stand_in.Builder()
    builder.build(8)
    assert builder._workspace_buffer is not None and not served.sealed
    assert served.untouched.startswith("it failed (NotImplementedError: FlashInfer backend on SM90")


def test_a_later_engine_of_the_process_gets_workspaces_of_its_own(vllm_stand_in):
    """Engines one after another in one process (a test suite, a notebook): each engine's profile
    makes its own workspaces, unsealed, and the last one's go as vLLM frees that engine, before
    the next measures the free memory (vLLM's profile fails where memory is freed during it)."""
    import gc
    import weakref

    served, runner = vllm_stand_in.served, vllm_stand_in.runner
    runner.profile_run()
    vllm_stand_in.Builder().build(8)
    vllm_stand_in.worker.compile_or_warm_up_model()
    first = weakref.ref(served.pools["attn.decode"].get("decode", 0))
    assert served.sealed and served.report()["growths"] == 3
    runner.profile_run()  # the same engine profiling again: nothing new
    assert served.pools["attn.decode"].get("decode", 0) is first()
    later = type(runner)()
    del runner, vllm_stand_in.runner, vllm_stand_in.worker
    gc.collect()
    assert first() is None and served.pools == {}  # let go with the first engine
    later.profile_run()
    assert not served.sealed and served.report()["growths"] == 0
    assert served.held_bytes == 6 * MIB  # the floors again, 2 + 4 MB
    builder = vllm_stand_in.Builder()
    wrapper = builder._get_decode_wrapper(8, True)
    assert wrapper.buffer is served.pools["attn.decode"].get("decode", 0).tensor
    later.capture_model()
    assert served.sealed


def test_an_engine_freed_after_the_next_one_profiled_leaves_the_next_ones_workspaces(
    vllm_stand_in,
):
    """Something kept the last engine alive past the next one's profile: freeing it later lets
    nothing of the engine now served go."""
    import gc

    served, first = vllm_stand_in.served, vllm_stand_in.runner
    first.profile_run()
    later = type(first)()
    later.profile_run()  # the first engine's workspaces let go here, at the latest
    workspace = served.pools["attn.decode"].get("decode", 0)
    del first, vllm_stand_in.runner, vllm_stand_in.worker
    gc.collect()
    assert served.pools["attn.decode"].get("decode", 0) is workspace
    assert served.serving and served.held_bytes == 6 * MIB


def test_an_engine_freed_as_the_interpreter_exits_gives_vllm_its_planner_back_without_an_import(
    vllm_stand_in, monkeypatch
):
    """vLLM's engine may be freed only at exit, when Python runs no import (``sys.meta_path`` is
    None): the plugin lets the engine go and puts vLLM's own decode planner back, raising
    nothing (an error in a weakref's callback would be printed as ignored)."""
    import gc

    own = backend.fast_plan_decode
    vllm_stand_in.runner.profile_run()
    assert backend.fast_plan_decode is not own
    ignored: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", ignored.append)
    for module in [m for m in sys.modules if m.startswith("mstar_resources.attn")]:
        monkeypatch.setitem(sys.modules, module, None)  # an import of it raises ImportError
    del vllm_stand_in.runner, vllm_stand_in.worker
    gc.collect()
    assert ignored == [] and backend.fast_plan_decode is own
    assert vllm_stand_in.served.pools == {}


def test_an_engine_started_after_the_setting_is_unset_runs_as_vllm_makes_it(
    vllm_stand_in, monkeypatch, caplog
):
    """The setting is read as the plugin loads; an engine of the same process that starts after
    it changed reads it again: unset, that engine keeps vLLM's own buffer, and set back, the next
    is served."""
    served, runner = vllm_stand_in.served, vllm_stand_in.runner
    monkeypatch.setenv(plugin.ENV_VAR, "")
    with caplog.at_level(logging.INFO, logger=workspaces.logger.name):
        runner.profile_run()
    builder = vllm_stand_in.Builder()
    builder.build(8)
    assert builder._workspace_buffer is not None and served.pools == {}
    assert served.untouched == f"{plugin.ENV_VAR} is unset as this engine starts"
    assert "vLLM keeps its own FlashInfer workspace" in caplog.text
    monkeypatch.setenv(plugin.ENV_VAR, "llama3-8b-h200")  # as it was when the plugin loaded
    second = type(runner)()  # each engine kept alive while it is looked at
    second.profile_run()
    assert served.untouched is None and served.held_bytes == 6 * MIB
    monkeypatch.setenv(plugin.ENV_VAR, "no-such-deployment")
    third = type(runner)()
    third.profile_run()
    assert served.pools == {} and "no-such-deployment" in served.untouched


def test_decode_plans_pass_through_the_plugin_only_while_an_engine_is_served(
    vllm_stand_in, monkeypatch
):
    """vLLM's own ``fast_plan_decode`` is in its module until an engine is served, and again once
    that engine is freed or the next one is left as vLLM makes it: no frame of the plugin's in
    the plans of an engine it does not serve."""
    import gc

    own, served = backend.fast_plan_decode, vllm_stand_in.served
    assert own.__name__ == "<lambda>"  # the stand-in's own
    runner_type = type(vllm_stand_in.runner)
    vllm_stand_in.runner.profile_run()
    planned = backend.fast_plan_decode
    # vLLM's own planned through the decode workspace (plan_through's one layer).
    assert planned is not own and planned.__wrapped__ is own
    del vllm_stand_in.runner, vllm_stand_in.worker
    gc.collect()
    assert backend.fast_plan_decode is own  # the engine freed
    monkeypatch.setenv(plugin.ENV_VAR, "")
    left_as_is = runner_type()
    left_as_is.profile_run()
    assert backend.fast_plan_decode is own and served.untouched
    monkeypatch.setenv(plugin.ENV_VAR, "llama3-8b-h200")
    again = runner_type()
    again.profile_run()
    assert backend.fast_plan_decode.__wrapped__ is own


def test_a_vllm_that_lacks_a_seam_leaves_every_later_engine_as_it_is(vllm_stand_in):
    served = vllm_stand_in.served
    served.block("this vLLM lacks FlashInfer's fast_plan_decode")
    for _ in range(2):
        type(vllm_stand_in.runner)().profile_run()
        assert served.pools == {} and "fast_plan_decode" in served.untouched


# -- waiting for a module's import ---------------------------------------------------------------


def test_a_callback_waits_for_the_import_and_the_module_keeps_its_loader(tmp_path, monkeypatch):
    from mstar_resources.integrations.plugin import when_imported

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


class _AnotherFinder:
    """A finder after the hook: raises once for ``name``, or registers another callback for it
    while the hook's search runs (as another thread would)."""

    def __init__(self, name: str, then) -> None:
        self.name, self.then, self.done = name, then, False

    def find_spec(self, name, path, target=None):
        if name == self.name and not self.done:
            self.done = True
            self.then()
        return None


def test_a_callback_survives_a_finder_that_fails_and_one_added_during_the_search(
    tmp_path, monkeypatch
):
    from mstar_resources.integrations.plugin import when_imported

    for name in ("hook_module_a", "hook_module_b"):
        (tmp_path / f"{name}.py").write_text("VALUE = 1\n")
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    when_imported("hook_module_a", lambda m: seen.append("a"))

    def fails() -> None:
        raise OSError("a finder's transient failure")

    monkeypatch.setattr(sys, "meta_path", [sys.meta_path[0], _AnotherFinder("hook_module_a", fails),
                                           *sys.meta_path[1:]])  # fmt: skip
    with pytest.raises(OSError):
        import hook_module_a
    import hook_module_a  # noqa: F401  (the import tried again)

    assert seen == ["a"]
    when_imported("hook_module_b", lambda m: seen.append("b1"))

    def another_callback() -> None:
        when_imported("hook_module_b", lambda m: seen.append("b2"))

    sys.meta_path.insert(1, _AnotherFinder("hook_module_b", another_callback))
    import hook_module_b  # noqa: F401

    assert seen == ["a", "b1", "b2"]


def test_decode_wrappers_keep_their_own_int_workspace_where_none_is_reserved(vllm_stand_in):
    """An int floor of 0 (what ``auto`` declares for prefill, and for decode where no int need
    was measured): no int workspace, and vLLM's decode wrappers keep FlashInfer's own pair,
    none counted as sharing."""
    served, runner = vllm_stand_in.served, vllm_stand_in.runner
    records = tuple(
        replace(r, int_declared_mb=0, int_floor=Floor(0, "declared", r.int_floor.setting))
        for r in served.setting.records
    )
    served.setting = workspaces.Setting(plugin.ENV_VAR, served.setting.value, records)
    runner.profile_run()
    assert served.pools["attn.decode"].get("decode", 0).int_workspace is None
    builder = vllm_stand_in.Builder()
    builder.indexed = True  # its wrappers keep an int workspace, as FlashInfer's do
    decode = builder._get_decode_wrapper(8, True)
    assert decode._int_workspace_buffer.numel() == 8 * MIB  # FlashInfer's own
    report = served.report()
    assert report["shared_int_wrappers"] == 0 and report["int_workspace_bytes"] == 0


def test_the_first_builders_decode_wrappers_share_the_decode_int_workspace(vllm_stand_in):
    served, runner = vllm_stand_in.served, vllm_stand_in.runner
    runner.profile_run()
    first, second = vllm_stand_in.Builder(), vllm_stand_in.Builder()
    first.indexed = second.indexed = True
    shared = served.pools["attn.decode"].get("decode", 0).int_workspace
    decodes = [first._get_decode_wrapper(b, True) for b in (1, 8, 64)]
    assert all(d._int_workspace_buffer is shared.tensor for d in decodes)
    assert all(d._pin_memory_int_workspace_buffer is shared.mirror for d in decodes)
    # Another KV-cache group's builder plans its wrapper before either runs: it keeps its own.
    other = second._get_decode_wrapper(8, True)
    assert other._int_workspace_buffer is not shared.tensor
    assert other._int_workspace_buffer.numel() == 8 * MIB
    # The prefill wrappers keep their own (several may be planned in one step).
    assert first._get_prefill_wrapper()._float_workspace_buffer is not None
    report = served.report()
    assert report["shared_int_wrappers"] == 3
    first.build(8)
    assert shared.tensor.numel() == 8 * MIB  # FlashInfer's 8 MiB, the default floor, holds it
    assert decodes[1].plans == 3  # planned, and planned again after each float growth


def test_vllm_029s_capture_to_measure_graph_memory_seals_nothing(vllm_stand_in):
    """vLLM 0.29's V2 runner measures its graphs' memory with a bare ``capture_model()`` before
    it sizes the KV cache and warms up (0.30+ says ``profile_only=True``): the workspaces stay
    growable until the capture that serves."""
    served, runner = vllm_stand_in.served, vllm_stand_in.runner
    runner.captures_to_profile = True
    runner.profile_run()
    runner.profile_cudagraph_memory()
    assert runner.captured == 1 and not served.sealed and not served.manager.sealed
    vllm_stand_in.worker.compile_or_warm_up_model()
    assert runner.captured == 2 and served.sealed
