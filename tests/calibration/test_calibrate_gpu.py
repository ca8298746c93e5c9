"""Calibration on a CUDA GPU through real FlashInfer wrappers, on a small profile with every
wrapper kind and backend calibration plans.

Kernel configurations (bf16, head dim 128): the decode kernel, the fa2 and fa3 prefill modules
(paged, ragged and POD's decode share them), POD's kernel, and MLA's fa2 and fa3 modules (compressed
KV 512, rotary 64), each built once per run.
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from mstar_resources import build_pools, resolve
from mstar_resources.attn.workspace import install_int_workspace
from mstar_resources.calibration.calibrate import measure_all, per_resource, table
from mstar_resources.calibration.measure import Planner, Shape, shapes_for
from mstar_resources.calibration.profile import load_profile
from mstar_resources.calibration.record import declared_mb_for

from ..sealing import assert_sealed
from .bounds import mla_bytes, prefill_bound_bytes

pytestmark = pytest.mark.gpu

PROFILE = {
    "model": {
        "num_qo_heads": 32,
        "num_kv_heads": 8,
        "head_dim": 128,
        "page_size": 16,
        "head_dim_ckv": 512,
        "head_dim_kpe": 64,
    },
    "limits": {"max_num_seqs": 64, "max_num_batched_tokens": 512, "max_model_len": 8192},
    "cuda_graph_batch_sizes": [1, 8, 64],
    "plans": {
        "decode": {"kind": "decode"},
        "eager_decode": {"kind": "decode"},
        "prefill": {"kind": "paged_prefill"},
        "prompt": {"kind": "ragged_prefill"},
        "prefill_fa3": {"kind": "paged_prefill", "backend": "fa3"},
        "prefill_auto": {"kind": "paged_prefill", "backend": "auto"},
        "prompt_fa3": {"kind": "ragged_prefill", "backend": "fa3"},
        "prompt_auto": {"kind": "ragged_prefill", "backend": "auto"},
        "pod": {"kind": "pod"},
        "eager_pod": {"kind": "pod"},
        "mla_decode": {"kind": "mla", "backend": "auto"},
        "mla_prefill": {"kind": "mla", "backend": "fa2"},
    },
}
PREFILL_LABELS = ["prefill", "prompt", "prefill_fa3", "prefill_auto", "prompt_fa3", "prompt_auto"]
RESOURCES = {
    "attn": {
        "decode": {"owner": "attention", "labels": ["decode"], "cg_slots": [0]},
        "eager_decode": {"owner": "attention", "labels": ["eager_decode"], "cg_slots": []},
        "prefill": {"owner": "attention", "labels": PREFILL_LABELS, "cg_slots": []},
        "pod": {"owner": "attention", "labels": ["pod"], "cg_slots": [0]},
        "eager_pod": {"owner": "attention", "labels": ["eager_pod"], "cg_slots": []},
    },
    "mla": {
        "decode": {"owner": "mla", "labels": ["mla_decode"], "cg_slots": [0]},
        "prefill": {"owner": "mla", "labels": ["mla_prefill"], "cg_slots": []},
    },
}
GROWTH_ONLY = {"prompt", "prompt_fa3", "prompt_auto", "pod", "eager_pod", "mla_decode",
               "mla_prefill"}  # fmt: skip


@pytest.fixture(scope="module")
def calibration():
    profile = load_profile(PROFILE)
    records = resolve(OmegaConf.create(RESOURCES), env={})
    rows = measure_all(records, profile, torch.device("cuda"), show_progress=False)
    print("\n" + table(rows))
    return profile, rows


def test_measured_bytes_equal_flashinfers_workspace_size_and_planned_growth(calibration):
    profile, rows = calibration
    by_label = {row.label: row for row in rows}
    methods = {label: row.need.method for label, row in by_label.items()}
    assert {label for label, method in methods.items() if method == "growth"} >= GROWTH_ONLY
    assert by_label["decode"].need.bytes > 0 and by_label["eager_decode"].need.bytes > 0
    assert not any(row.need.refused for row in rows), [row.need.refused for row in rows]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for label in ("mla_decode", "mla_prefill"):  # MLA's need is the grid's, whatever the shape
        assert by_label[label].need.bytes == mla_bytes(512, sms), label
    bound = prefill_bound_bytes(32, 8, 128, sms)
    assert all(by_label[label].need.bytes <= bound for label in [*PREFILL_LABELS, "eager_pod"])
    planner = Planner(profile, torch.device("cuda"))
    for label in ("decode", "eager_decode", "prefill"):
        plan = profile.plans[label]
        graph = label == "decode"
        grown = planner.need_by_growth(plan, shapes_for(plan, profile, graph), None)
        # Growth from an empty buffer through real plans lands on FlashInfer's own figure, for
        # the float workspace and the int one.
        assert grown.bytes == by_label[label].need.bytes, label
        assert grown.int_bytes == by_label[label].need.int_bytes, label
        assert 0 < grown.int_bytes < 8 << 20, label  # far below each wrapper's own 8 MiB


# Shapes calibration did not plan: between its batch sizes, contexts and query lengths. The
# calibrated floors (need + margin) must hold them too.
GRAPH = [Shape(b, 1, 8192, cuda_graph=True) for b in (3, 24, 48)]
EAGER_DECODE = [Shape(b, 1, kv) for b in (3, 24, 48) for kv in (3000, 6000)]
PREFILL = [Shape(b, q, kv) for b in (1, 3, 12) for q in (3, 24) for kv in (3000, 8000)]
RAGGED = [Shape(b, q, q) for b in (1, 3, 12) for q in (24, 40)] + PREFILL
BETWEEN = {
    "decode": GRAPH,
    "eager_decode": EAGER_DECODE,
    "pod": GRAPH,
    "eager_pod": EAGER_DECODE,
    "mla_decode": GRAPH,
    "mla_prefill": PREFILL,
    **dict.fromkeys(["prefill", "prefill_fa3", "prefill_auto"], PREFILL),
    **dict.fromkeys(["prompt", "prompt_fa3", "prompt_auto"], RAGGED),
}


def test_the_calibrated_floors_hold_every_plan_without_growth(calibration):
    profile, rows = calibration
    node = OmegaConf.create(RESOURCES)
    for measured in per_resource(rows):
        group, name = measured.path.split(".")
        node[group][name].declared_mb = declared_mb_for(measured.need_bytes)
        if measured.int_need_bytes is not None:
            node[group][name].int_declared_mb = declared_mb_for(measured.int_need_bytes)
    pools = build_pools(node, "cuda", env={})
    for pool in pools.values():
        pool.seal()  # any growth would now raise
    planner = Planner(profile, torch.device("cuda"))
    for record in resolve(node, env={}):
        for label in record.labels:
            plan = profile.plans[label]
            slot = record.cg_slots[0] if record.cg_slots else None
            workspace = pools[record.path].get(label, slot)
            wrapper_for = planner.wrappers(plan, workspace.tensor)
            for shape in shapes_for(plan, profile, bool(record.cg_slots)) + BETWEEN[label]:
                args, kwargs = planner.plan_args(plan, shape)
                wrapper = wrapper_for(shape)
                install_int_workspace(wrapper, workspace)  # where it keeps one
                workspace.plan(wrapper.plan, *args, **kwargs)
            assert_sealed(workspace)
