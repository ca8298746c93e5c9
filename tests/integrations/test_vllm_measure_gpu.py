"""``auto``'s measurement as vLLM's memory profile sees it, on a CUDA GPU with FlashInfer (no vLLM
needed): what the measurement takes and frees is left out of torch's peak, so the profile counts
only the workspaces kept; a peak reached before the measurement is kept.

The kernel configuration is the attention GPU tests' (bf16, head dim 128, 32 query and 8 KV heads,
page 16), so FlashInfer builds nothing new.
"""

from __future__ import annotations

import gc

import pytest
import torch

from mstar_resources.calibration.profile import load_profile
from mstar_resources.integrations.vllm.workspaces import left_out_of_peak, measured_need
from mstar_resources.units import MIB

pytestmark = pytest.mark.gpu

PROFILE = {
    "model": {"num_qo_heads": 32, "num_kv_heads": 8, "head_dim": 128, "page_size": 16},
    "limits": {"max_num_seqs": 256, "max_num_batched_tokens": 4096, "max_model_len": 8192},
    "cuda_graph_batch_sizes": [1, 64, 256],
    "plans": {"decode": {"kind": "decode"}, "prefill": {"kind": "paged_prefill"}},
}


def _profile_window(device: torch.device) -> int:
    """As vLLM's memory_profiling starts: the cache emptied, the peak reset; the bytes allocated.
    Earlier tests' garbage is collected first, or the measurement's collection would free it
    inside the window."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def test_the_measurement_costs_the_peak_only_what_is_kept():
    device = torch.device("cuda")
    profile = load_profile(PROFILE)
    start = _profile_window(device)
    with left_out_of_peak(device):
        need = measured_need(profile, "decode", True, device)
        seen = torch.cuda.max_memory_allocated(device) - start
        kept = torch.zeros(need.need_bytes, dtype=torch.uint8, device=device)
    peak = torch.cuda.max_memory_allocated(device) - start
    print(f"\ndecode need {need.need_bytes:,} bytes by {need.method}; peak while measuring "
          f"+{seen:,}, after +{peak:,}")  # fmt: skip
    assert need.need_bytes > 0
    if need.method == "growth":  # FlashInfer 0.6: no size query, a workspace grown to fit
        assert seen > need.need_bytes  # the measurement took more than it keeps...
    assert peak == torch.cuda.memory_allocated(device) - start == kept.numel()  # ...left out


def test_a_peak_reached_before_the_measurement_is_kept():
    device = torch.device("cuda")
    start = _profile_window(device)
    earlier = torch.empty(64 * MIB, dtype=torch.uint8, device=device)
    del earlier  # a transient of vLLM's own, before the plugin's measurement
    with left_out_of_peak(device):
        scratch = torch.empty(16 * MIB, dtype=torch.uint8, device=device)
        del scratch
    assert torch.cuda.max_memory_allocated(device) - start == 64 * MIB


def test_the_measurement_frees_what_it_allocated_without_the_garbage_collector():
    """Its wrappers, workspaces and graphs are freed as it returns, by their last reference: no
    cycle holds them until a collection (both plugins free the measurement's memory so)."""
    device = torch.device("cuda")
    profile = load_profile(PROFILE)
    start = _profile_window(device)
    gc.disable()
    try:
        need = measured_need(profile, "decode", True, device)
        left = torch.cuda.memory_allocated(device) - start
    finally:
        gc.enable()
    assert need.need_bytes > 0
    assert left == 0
