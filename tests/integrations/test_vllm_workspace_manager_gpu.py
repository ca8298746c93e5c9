"""vLLM's WorkspaceManager as a resource on a CUDA GPU (no vLLM needed): the stand-in of vLLM
0.26's manager (``test_vllm_workspace_manager``) with its buffers on the GPU, so the floor, the
budget check and the seal meet the GPU's own memory figures."""

from __future__ import annotations

import pytest
import torch

from mstar_resources.errors import ResourceConfigError, WorkspaceSealedError
from mstar_resources.units import MIB
from tests.integrations import test_vllm_plugin, test_vllm_workspace_manager

pytestmark = pytest.mark.gpu

vllm_stand_in = test_vllm_plugin.vllm_stand_in  # the stand-in engine (a fixture)


def on_gpu(stand_in, monkeypatch, declared_mb):
    """The stand-in engine, its manager on the GPU and the GPU's own memory figures."""
    mem_get_info = torch.cuda.mem_get_info
    state, manager = test_vllm_workspace_manager.served(
        stand_in, monkeypatch, declared_mb=declared_mb, cg_slots=(0,)
    )
    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    manager._device = torch.device("cuda")
    return state, manager


def test_the_floor_is_made_on_the_gpu_and_sealed_at_capture(vllm_stand_in, monkeypatch):
    _, manager = on_gpu(vllm_stand_in, monkeypatch, declared_mb=64)
    before = torch.cuda.memory_allocated()
    vllm_stand_in.runner.profile_run()
    slot = manager._current_workspaces[0]
    assert slot.is_cuda and slot.numel() == 64 * MIB
    assert torch.cuda.memory_allocated() - before >= 64 * MIB
    vllm_stand_in.runner.capture_model()
    with pytest.raises(WorkspaceSealedError):
        test_vllm_workspace_manager.moe_kernel(manager, 64 * MIB + 1)
    assert manager._current_workspaces[0] is slot


def test_a_floor_past_the_share_vllm_is_given_is_refused_before_allocating(
    vllm_stand_in, monkeypatch
):
    total = torch.cuda.mem_get_info()[1]
    _, manager = on_gpu(vllm_stand_in, monkeypatch, declared_mb=(total // MIB) // 2)
    vllm_stand_in.runner.vllm_config.cache_config.gpu_memory_utilization = 0.3
    before = torch.cuda.memory_allocated()
    with pytest.raises(ResourceConfigError) as refused:
        vllm_stand_in.runner.profile_run()
    assert "gpu_memory_utilization=0.3 of the GPU's" in str(refused.value)
    assert torch.cuda.memory_allocated() == before and manager._current_workspaces == [None, None]
