"""The shipped calibrated floors are bounds: no shape within a deployment's limits needs more.

For every shipped calibrated deployment, a dense sweep and a seeded random sample of plans within
its limits (batches of mixed lengths included) ask FlashInfer's own ``workspace_size()``: none
needs more than the need the deployment records (and so than its floor), and the sweep, which
includes the bounding configurations of bounds.py, finds exactly that need.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from mstar_resources.calibration.bounds import mla_bytes, prefill_bound_bytes
from mstar_resources.profile import PlanKind, load_profile

from ..conftest import compose_shipped

pytestmark = pytest.mark.gpu

CONF = Path(__file__).parents[2] / "conf" / "deployment"
CALIBRATED = sorted(p.stem for p in CONF.glob("*_calibrated.yaml"))
SAMPLES = 150


def _kinds(deployment: str) -> set[PlanKind]:
    profile = load_profile(compose_shipped([f"deployment={deployment}"]).calibration)
    return {plan.kind for plan in profile.plans.values()}


DENSE = [d for d in CALIBRATED if PlanKind.mla not in _kinds(d)]
MLA = [d for d in CALIBRATED if PlanKind.mla in _kinds(d)]


def _lengths_to_args(q_lens, kv_lens, page, heads, dtypes, prefill):
    device = torch.device("cuda")
    pages = [-(-kv // page) for kv in kv_lens]
    kv_indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], dtype=torch.int32)
    indices = torch.zeros(sum(pages), dtype=torch.int32, device=device)
    last = torch.tensor([kv - (p - 1) * page for kv, p in zip(kv_lens, pages, strict=True)],
                        dtype=torch.int32)  # fmt: skip
    paged = (kv_indptr.to(device), indices, last.to(device), *heads, page)
    if not prefill:
        return paged, dtypes
    qo = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    return (qo.to(device), *paged), {"causal": True, **dtypes}


def _needs(deployment):
    """The deployment's profile, and the need it records for each plan label."""
    cfg = compose_shipped([f"deployment={deployment}"])
    profile = load_profile(cfg.calibration)
    record = OmegaConf.to_container(cfg.calibrated)
    assert isinstance(record, dict)
    recorded = {n["worst"].split(":")[0]: n["need_bytes"] for n in record["needs"]}
    return profile, recorded


@pytest.mark.parametrize("deployment", DENSE)
def test_no_plan_within_the_limits_needs_more_than_the_recorded_need(deployment):
    import flashinfer

    profile, recorded = _needs(deployment)
    model, limits = profile.model, profile.limits
    heads = (model.num_qo_heads, model.num_kv_heads, model.head_dim)
    dtypes = {"q_data_type": getattr(torch, model.q_dtype),
              "kv_data_type": getattr(torch, model.kv_dtype)}  # fmt: skip
    selector = torch.empty(0, dtype=torch.uint8, device="cuda")
    page, longest = model.page_size, limits.max_model_len
    rng = random.Random(0)

    # Decode under graphs: every graph batch size, over short and long contexts.
    graph_needs = []
    for batch in profile.cuda_graph_batch_sizes:
        for kv in (1, page * 8 + 1, 4096, longest):
            args, kwargs = _lengths_to_args([], [kv] * batch, page, heads, dtypes, False)
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                selector, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=args[0],
                paged_kv_indices_buffer=args[1], paged_kv_last_page_len_buffer=args[2],
                backend="fa2",
            )  # fmt: skip
            graph_needs.append(wrapper.workspace_size(*args, **kwargs)[0])
    assert max(graph_needs) == recorded["decode"]

    # Eager paged prefill: a dense grid of uniform batches, then random mixed batches.
    prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(selector, "NHD", backend="fa2")
    budget, seqs = limits.max_num_batched_tokens, limits.max_num_seqs
    uniform = [
        (b, q, kv)
        for b in (1, 2, 3, 4, 8, 16, 33, 64, 256)
        for q in (1, 2, 4, 8, 9, 16, 17, 32, 33, 64, 65, 128, 512, 2048, 8192)
        for kv in (q, 1024, 4224, 33_792, 65_536, longest)
        if b <= seqs and b * q <= budget and q <= kv <= longest
    ]
    mixed = []
    for _ in range(SAMPLES):
        b = rng.randint(1, min(seqs, 64))
        q_lens = [rng.randint(1, max(1, budget // b // 4)) for _ in range(b)]
        mixed.append((q_lens, [rng.randint(q, longest) for q in q_lens]))
    prefill_needs = []
    for b, q, kv in uniform:
        args, kwargs = _lengths_to_args([q] * b, [kv] * b, page, heads, dtypes, True)
        prefill_needs.append(prefill.workspace_size(*args, **kwargs)[0])
    for q_lens, kv_lens in mixed:
        args, kwargs = _lengths_to_args(q_lens, kv_lens, page, heads, dtypes, True)
        prefill_needs.append(prefill.workspace_size(*args, **kwargs)[0])
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bound = prefill_bound_bytes(*heads, sms)
    assert max(prefill_needs) <= recorded["prefill"] <= bound
    assert max(prefill_needs) == recorded["prefill"]  # the sweep holds a bounding shape


@pytest.mark.parametrize("deployment", MLA)
def test_every_mla_plan_fits_the_calibrated_floor_sealed_and_needs_the_bound(deployment):
    """MLA plans of every graph batch size and of random mixed batches, decode and prefill, on
    the calibrated workspaces sealed: none overflows, and each label's recorded need is the
    bound, which one plan on an empty workspace grows to exactly."""
    from mstar_resources import build_pools
    from mstar_resources.calibration.measure import Planner
    from mstar_resources.calibration.shapes import Shape

    cfg = compose_shipped([f"deployment={deployment}"])
    profile, recorded = _needs(deployment)
    limits, model = profile.limits, profile.model
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bound = mla_bytes(model.head_dim_ckv, sms)
    planner = Planner(profile, torch.device("cuda"))
    pools = build_pools(cfg.resources, "cuda", env={})
    rng = random.Random(0)
    for path, pool in pools.items():
        pool.reserve()
        pool.seal()
        for (label, slot), workspace in pool.workspaces().items():
            assert recorded[label] == bound, (label, recorded[label], bound)
            plan = profile.plans[label]
            if slot is not None:
                shapes = [Shape(b, 1, kv, cuda_graph=True)
                          for b in profile.cuda_graph_batch_sizes
                          for kv in (1, 4096, limits.max_model_len)]  # fmt: skip
            else:
                shapes = []
                for _ in range(SAMPLES // 3):
                    b = rng.randint(1, 64)
                    q = rng.choice([1, rng.randint(2, limits.max_num_batched_tokens // b)])
                    shapes.append(Shape(b, q, rng.randint(q, limits.max_model_len)))
            wrapper_for = planner.wrappers(plan, workspace.tensor)
            for shape in shapes:
                args, kwargs = planner.plan_args(plan.kind, shape)
                workspace.plan(wrapper_for(shape).plan, *args, **kwargs)  # sealed: no growth
            assert workspace.stats().times_grown == 0, path
            fresh = planner.need_by_growth(plan, shapes[:1], None)
            assert fresh.bytes == bound
