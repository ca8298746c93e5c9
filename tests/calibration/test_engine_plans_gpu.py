"""Calibrating the plans an engine makes, on the FlashInfer installed: the Qwen3.5-122B-A10B-class
deployment with vLLM 0.33's plans (tensor-core decode at every graph batch up to 512).

On FlashInfer 0.6.x that plan's need grows with the graph batch past vLLM's default buffer (the
public crash reports); on 0.7.4 it stays small. Either way the calibrated floor is the scheduler's
own arithmetic (``bounds.tensor_core_graph_bytes``) at the worst graph batch, and a workspace of
that floor, sealed, plans the largest graph batch over short and long contexts without overflow.
"""

from __future__ import annotations

import pytest
import torch

from mstar_resources import Workspace, resolve
from mstar_resources.calibration.calibrate import measure_all
from mstar_resources.calibration.measure import Planner, Shape
from mstar_resources.calibration.profile import installed_flashinfer, load_profile
from mstar_resources.calibration.record import declared_mb_for
from mstar_resources.units import MIB, release

from ..conftest import compose_shipped
from ..scripts import load_script
from ..sealing import assert_sealed
from .bounds import tensor_core_graph_bytes

pytestmark = pytest.mark.gpu

DEPLOYMENT = "qwen3.5-122b-a10b-h200"


def test_vllms_decode_plans_are_calibrated_to_the_bound_and_hold_the_largest_graph_batch():
    cfg = compose_shipped([f"deployment={DEPLOYMENT}"])
    profile = load_profile(cfg.calibration)
    decode = [r for r in resolve(cfg.resources, env={}) if r.path == "attn.decode"]
    (row,) = measure_all(decode, profile, torch.device("cuda"), show_progress=False)

    model, sizes = profile.model, profile.cuda_graph_batch_sizes
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    version = installed_flashinfer() or "none"
    heads = (model.num_qo_heads, model.num_kv_heads, model.head_dim)
    by_batch = {b: tensor_core_graph_bytes(*heads, b, sms, release(version)) for b in sizes}
    vllm_default = load_script("_engines").vllm_buffer_mb(profile) * MIB  # type: ignore[operator]
    print(f"\nFlashInfer {version}: {DEPLOYMENT} decode needs {row.need.bytes:,} bytes at "
          f"{row.need.worst}; vLLM's buffer {vllm_default:,}; bound by batch "
          f"{ {b: by_batch[b] for b in sizes[-3:]} }")  # fmt: skip
    assert row.need.bytes == max(by_batch.values())

    largest = max(sizes)
    floor = declared_mb_for(row.need.bytes) * MIB
    workspace = Workspace(torch.zeros(floor, dtype=torch.uint8, device="cuda"), "decode")
    workspace.seal()  # an overflow now raises
    planner = Planner(profile, torch.device("cuda"))
    plan = profile.plans["decode"]
    for kv in (128, 4096, profile.limits.max_model_len):
        shape = Shape(largest, 1, kv, cuda_graph=True)
        args, kwargs = planner.plan_args(plan, shape)
        workspace.plan(planner.wrapper(plan, workspace.tensor, shape).plan, *args, **kwargs)
    assert_sealed(workspace)
