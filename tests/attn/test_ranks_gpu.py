"""Two NCCL ranks, one GPU each, agree on their workspaces, then capture and replay real FlashInfer
decode graphs over them.

Rank 0 plans a graph batch of 8 before sealing, which grows its graph workspace; rank 1 plans an
eager batch of 64 instead, which grows its eager one, and plans its graph batch of 32 only after
sealing, on the size it agreed with rank 0. Without agreement that plan would overflow rank 1's
sealed 1 MiB workspace. Run on a machine with two GPUs (``nvidia-h200-x2``):

    source .gpu/env.sh && python3 -m pytest -m gpu tests/attn/test_ranks_gpu.py
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from mstar_resources import WorkspacePool
from mstar_resources.units import MIB

from ..ranks import run_ranks
from .test_workspace_gpu import Decode, capture

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        torch.cuda.device_count() < 2,
        reason=f"needs 2 CUDA GPUs; torch sees {torch.cuda.device_count()}",
    ),
]

SERVES = [("decode", None), ("decode", 0)]
GRAPH_BATCH = {0: 8, 1: 32}


def plan_seal_capture(rank: int, world: int) -> dict[str, Any]:
    pool = WorkspacePool(
        torch.device("cuda", rank), 1, config_key="resources.attn.decode", serves=SERVES
    )
    reserved = pool.reserve()
    graph_workspace, eager_workspace = pool.get("decode", 0), pool.get("decode")
    decode = Decode(batch=GRAPH_BATCH[rank], kv_len=2048)
    wrapper = decode.wrapper(graph_workspace.tensor, graph=True)
    if rank == 0:
        graph_workspace.plan(wrapper.plan, *decode.plan_args, **decode.plan_kwargs)
    else:
        eager = Decode(batch=64, kv_len=4096)
        eager_wrapper = eager.wrapper(eager_workspace.tensor)
        eager_workspace.plan(eager_wrapper.plan, *eager.plan_args, **eager.plan_kwargs)

    pool.seal(group=dist.group.WORLD)
    addresses = {key: w.tensor.data_ptr() for key, w in pool.workspaces().items()}
    if rank == 1:  # sealed now: it fits only because rank 0's size was agreed
        graph_workspace.plan(wrapper.plan, *decode.plan_args, **decode.plan_kwargs)

    graph, out = capture(lambda: wrapper.run(decode.q, decode.kv_cache))
    decode.q.copy_(torch.randn_like(decode.q))  # the replay must follow new inputs
    graph.replay()
    torch.cuda.synchronize()

    reference_buffer = torch.zeros(512 * MIB, dtype=torch.uint8, device="cuda")
    reference = decode.wrapper(reference_buffer, graph=True)
    reference.plan(*decode.plan_args, **decode.plan_kwargs)
    return {
        "reserved": reserved,
        "sizes": {f"{k[0]}/{k[1]}": w.tensor.numel() for k, w in pool.workspaces().items()},
        "equal": torch.equal(out, reference.run(decode.q, decode.kv_cache)),
        "still": addresses == {k: w.tensor.data_ptr() for k, w in pool.workspaces().items()},
        "sealed": all(w.sealed for w in pool.workspaces().values()),
        "grown_to_agree": {s.name: s.grown_to_agree_bytes for s in pool.stats()},
        "graph_need": decode.float_bytes(wrapper),
    }


def test_two_nccl_ranks_agree_then_capture_and_replay(tmp_path):
    first, second = run_ranks(plan_seal_capture, 2, tmp_path / "store", "nccl", deadline_s=600)
    assert isinstance(first, dict) and isinstance(second, dict), (first, second)
    assert first["reserved"] == second["reserved"] == 2 * MIB  # both keys made up front
    assert first["sizes"] == second["sizes"]  # the same keys, the same bytes
    assert first["sizes"]["decode/0"] == first["graph_need"] > MIB
    assert second["sizes"]["decode/None"] > MIB  # rank 1's eager plan, agreed by rank 0
    assert first["equal"] and second["equal"]
    assert first["still"] and second["still"] and first["sealed"] and second["sealed"]
    assert first["grown_to_agree"]["attention:decode"] == second["sizes"]["decode/None"] - MIB
    assert second["grown_to_agree"]["attention:decode:cg0"] == first["graph_need"] - MIB
