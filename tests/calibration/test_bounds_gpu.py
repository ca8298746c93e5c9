"""The shipped calibrated floors are bounds: no shape within a deployment's limits needs more.

For every shipped calibrated deployment, on the FlashInfer it was calibrated on, the plans its
engine makes (as its profile declares them) at every graph batch size and at a seeded
random sample of shapes within its limits run on its floors sealed: none overflows, and the
calibration's own shapes, which include the bounding configurations of bounds.py, grow an empty
workspace to exactly the recorded need.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from mstar_resources import build_pools, resolve
from mstar_resources.calibration.measure import Planner, Shape, shapes_for
from mstar_resources.calibration.profile import PlanKind, installed_flashinfer, load_profile
from mstar_resources.calibration.record import planned

from ..conftest import compose_shipped
from ..sealing import assert_sealed
from .bounds import mla_bytes

pytestmark = pytest.mark.gpu

CONF = Path(__file__).parents[2] / "conf" / "deployment"
CALIBRATED = sorted(p.stem for p in CONF.glob("*_calibrated.yaml"))
SAMPLES = 150


def _kinds(deployment: str) -> set[PlanKind]:
    profile = load_profile(compose_shipped([f"deployment={deployment}"]).calibration)
    return {plan.kind for plan in profile.plans.values()}


DENSE = [d for d in CALIBRATED if PlanKind.mla not in _kinds(d)]
MLA = [d for d in CALIBRATED if PlanKind.mla in _kinds(d)]


def _needs(deployment):
    """The deployment's profile, and the need it records for each plan label."""
    cfg = compose_shipped([f"deployment={deployment}"])
    profile = load_profile(cfg.calibration)
    record = OmegaConf.to_container(cfg.calibrated)
    assert isinstance(record, dict)
    recorded = {n["worst"].split(":")[0]: n["need_bytes"] for n in record["needs"]}
    return profile, recorded


def _calibrated_here(cfg) -> None:
    """Skip, saying why, where the installed FlashInfer is not the one the deployment was
    calibrated on: its floors are claimed for that version only."""
    recorded, here = str(cfg.calibrated.flashinfer), installed_flashinfer()
    if recorded != here:
        pytest.skip(f"calibrated on FlashInfer {recorded}, and this is {here}")


def _calibrated_pools(cfg):
    """The pools of the workspaces calibration plans (not vLLM's WorkspaceManager, which MoE
    kernels fill), on the GPU."""
    return build_pools(planned(resolve(cfg.resources, env={})), "cuda", env={})


def _random_shapes(plan, profile, graph: bool, rng: random.Random) -> list[Shape]:
    """Plans the deployment's engine makes that calibration did not: every graph batch size over
    contexts between its shapes', and random eager batches within the limits."""
    limits, q = profile.limits, plan.q_len_per_req
    longest = limits.max_model_len
    if graph:
        return [Shape(b, q, kv, cuda_graph=True)
                for b in profile.cuda_graph_batch_sizes
                for kv in (q, rng.randint(q, 4096), rng.randint(q, longest))]  # fmt: skip
    shapes = []
    for _ in range(SAMPLES):
        b = rng.randint(1, min(limits.max_num_seqs, limits.max_num_batched_tokens))
        q_len = (
            q
            if plan.kind is PlanKind.decode
            else rng.randint(1, max(1, limits.max_num_batched_tokens // b))
        )
        shapes.append(Shape(b, q_len, rng.randint(min(q_len, longest), longest)))
    return shapes


@pytest.mark.parametrize("deployment", DENSE)
def test_sealed_floors_hold_random_plans_of_the_deployments_engine(deployment):
    """On the calibrated workspaces, reserved and sealed, the plans the deployment's engine makes
    (tensor-core decode at every graph batch size, random prefill batches within the limits)
    never overflow; and each label's recorded need is what its calibration shapes grow an empty
    workspace to, so the floor is that bound, not a guess above it."""
    cfg = compose_shipped([f"deployment={deployment}"])
    _calibrated_here(cfg)
    profile, recorded = _needs(deployment)
    planner = Planner(profile, torch.device("cuda"))
    pools = _calibrated_pools(cfg)
    rng = random.Random(0)
    for pool in pools.values():
        pool.reserve()
        pool.seal()
        for (label, slot), workspace in pool.workspaces().items():
            plan, graph = profile.plans[label], slot is not None
            shapes = shapes_for(plan, profile, graph) + _random_shapes(plan, profile, graph, rng)
            wrapper_for = planner.wrappers(plan, workspace.tensor)
            for shape in shapes:
                args, kwargs = planner.plan_args(plan, shape)
                workspace.plan(wrapper_for(shape).plan, *args, **kwargs)  # sealed: no growth
            assert_sealed(workspace)
            if label in recorded and slot in (None, 0):
                grown = planner.need_by_growth(plan, shapes_for(plan, profile, graph), None)
                assert grown.bytes == recorded[label], (label, grown.bytes, recorded[label])


@pytest.mark.parametrize("deployment", MLA)
def test_every_mla_plan_fits_the_calibrated_floor_sealed_and_needs_the_bound(deployment):
    """MLA plans of every graph batch size and of random mixed batches, decode and prefill, on
    the calibrated workspaces sealed: none overflows, and each label's recorded need is the
    bound, which one plan on an empty workspace grows to exactly."""
    cfg = compose_shipped([f"deployment={deployment}"])
    _calibrated_here(cfg)
    profile, recorded = _needs(deployment)
    limits, model = profile.limits, profile.model
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bound = mla_bytes(model.head_dim_ckv, sms)
    planner = Planner(profile, torch.device("cuda"))
    pools = _calibrated_pools(cfg)
    rng = random.Random(0)
    for pool in pools.values():
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
                args, kwargs = planner.plan_args(plan, shape)
                workspace.plan(wrapper_for(shape).plan, *args, **kwargs)  # sealed: no growth
            assert_sealed(workspace)
            fresh = planner.need_by_growth(plan, shapes[:1], None)
            assert fresh.bytes == bound
