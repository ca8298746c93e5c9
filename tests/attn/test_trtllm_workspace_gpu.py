"""FlashInfer's XQA decode (``xqa_batch_decode_with_kv_cache``, the TRT-LLM kernel engines run on
Hopper) on a workspace of exactly ``xqa_workspace_bytes`` followed by a guard region of random
bytes: over batch sizes 1 to 512 and KV lengths up to MAX_MODEL_LEN, one workspace reused as an
engine reuses it, the guard stays intact, the semaphores return to zero, the output matches plain
attention on the gathered pages, and the split that needs the most scratch writes its last bytes.

Two kernel configurations (bf16, head dim 128, page 16; 32/8 and 40/8 heads), built together on
first use. Runs as is under ``compute-sanitizer --tool memcheck``:
``python -m pytest tests/attn/test_trtllm_workspace_gpu.py``.
"""

from __future__ import annotations

import math
import sys

import pytest
import torch

from mstar_resources.attn.trtllm_workspace import (
    XQA_SEMAPHORE_BYTES,
    TrtllmLaunchCheck,
    xqa_workspace_bytes,
)
from mstar_resources.attn.workspace import Workspace
from mstar_resources.errors import WorkspaceSealedError

pytestmark = pytest.mark.gpu

DTYPE = torch.bfloat16
HEAD_DIM = 128
PAGE = 16
MAX_MODEL_LEN = 32768
LONGEST_UNSPLIT = 1024  # batches too large to split read shorter contexts: the pool stays small
GUARD = 4 << 20
LAYOUTS = [(32, 8), (40, 8)]
FP8 = torch.float8_e4m3fn
DRAFTS = 16  # speculative tokens a request: 16 x 4 query heads = two 32-row token blocks
SPECULATIVE = (1, 3)  # vLLM's num_speculative_tokens k: decode launches of 1 + k tokens a request


@pytest.fixture(scope="module")
def sm_count() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


@pytest.fixture(scope="module", autouse=True)
def _built_kernels() -> None:
    """Both XQA modules compiled in one ninja run (each otherwise builds alone on first use)."""
    from flashinfer.jit.core import build_jit_specs
    from flashinfer.jit.xqa import gen_xqa_module

    specs = [gen_xqa_module(DTYPE, DTYPE, PAGE, HEAD_DIM, qo // kv, False, DTYPE, 1)
             for qo, kv in LAYOUTS]  # fmt: skip
    specs.append(gen_xqa_module(DTYPE, FP8, PAGE, HEAD_DIM, 5, False, DTYPE, 1))
    specs.append(gen_xqa_module(DTYPE, DTYPE, PAGE, HEAD_DIM, 4, False, DTYPE, DRAFTS))
    specs += [gen_xqa_module(DTYPE, kv_dtype, PAGE, HEAD_DIM, 4, False, DTYPE, 1 + k)
              for kv_dtype in (DTYPE, FP8) for k in SPECULATIVE]  # fmt: skip
    build_jit_specs(specs)


def bound(qo: int, kv: int, sm_count: int, batch: int = 512, **kwargs: int | bool) -> int:
    kwargs = {"max_seq_len": MAX_MODEL_LEN, **kwargs}
    return xqa_workspace_bytes(batch=batch, num_qo_heads=qo, num_kv_heads=kv, head_dim=HEAD_DIM,
                               sm_count=sm_count, **kwargs)  # fmt: skip


def guarded(nbytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A zeroed workspace of ``nbytes`` (a view) followed by GUARD random bytes, and those bytes."""
    gen = torch.Generator(device="cuda").manual_seed(nbytes)
    pattern = torch.randint(0, 256, (GUARD,), dtype=torch.uint8, device="cuda", generator=gen)
    buf = torch.zeros(nbytes + GUARD, dtype=torch.uint8, device="cuda")
    buf[nbytes:] = pattern
    return buf, pattern


def decode_case(qo: int, kv: int, lens: list[int], seed: int, width: int = MAX_MODEL_LEN,
                kv_dtype: torch.dtype = DTYPE, q_len: int = 1) -> tuple:  # fmt: skip
    """Query (``q_len`` rows a request), paged K/V (each request on pages of its own, in random
    order), the page table ``width`` tokens wide as an engine's, and the sequence lengths."""
    pages = [-(-n // PAGE) for n in lens]
    order = torch.randperm(sum(pages), generator=torch.Generator().manual_seed(seed))
    table = torch.zeros(len(lens), width // PAGE, dtype=torch.int32)
    start = 0
    for i, p in enumerate(pages):
        table[i, :p] = order[start : start + p]
        start += p
    table = table.cuda()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = (sum(pages), PAGE, kv, HEAD_DIM)
    k, v = (torch.randn(shape, device="cuda", generator=gen).to(kv_dtype) for _ in range(2))
    q = torch.randn(len(lens) * q_len, qo, HEAD_DIM, device="cuda", generator=gen).to(DTYPE)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    return q, k, v, table, seq_lens


def reference(q, k, v, table, seq_lens) -> torch.Tensor:
    """Plain attention in float32 over the pages each request's table names."""
    batch, qo, _ = q.shape
    kv = k.shape[2]
    k, v = k.to(DTYPE), v.to(DTYPE)  # exact from fp8
    out = torch.empty(batch, qo, HEAD_DIM, dtype=torch.float32, device="cuda")
    longest = int(seq_lens.max())
    chunk = max(1, (1 << 18) // longest)
    for s in range(0, batch, chunk):
        rows = slice(s, s + chunk)
        pages = table[rows, : -(-longest // PAGE)].long()
        keys = k[pages].flatten(1, 2)[:, :longest].float()  # [c, tokens, kv, d]
        values = v[pages].flatten(1, 2)[:, :longest].float()
        query = q[rows].float().view(-1, kv, qo // kv, HEAD_DIM)
        scores = torch.einsum("chgd,cthd->chgt", query, keys) / math.sqrt(HEAD_DIM)
        past = torch.arange(longest, device="cuda") >= seq_lens[rows, None]
        scores.masked_fill_(past[:, None, None, :], float("-inf"))
        probs = scores.softmax(-1)
        out[rows] = torch.einsum("chgt,cthd->chgd", probs, values).reshape(-1, qo, HEAD_DIM)
    return out


def run_xqa(q, k, v, table, seq_lens, workspace: torch.Tensor, **kwargs) -> torch.Tensor:
    from flashinfer.decode import xqa_batch_decode_with_kv_cache

    scale = 1.0 / math.sqrt(HEAD_DIM)
    out = xqa_batch_decode_with_kv_cache(q, (k, v), workspace, table, seq_lens, MAX_MODEL_LEN,
                                         bmm1_scale=scale, **kwargs)  # fmt: skip
    torch.cuda.synchronize()
    return out


def batch_sweep(kv: int, sm_count: int) -> list[int]:
    """1, both sides of the largest batch that splits (b x KV heads <= SMs / 2) and of the one
    that fills the SMs, a mid size and 512."""
    split, full = sm_count // (2 * kv), sm_count // kv
    return sorted({1, 3, split, split + 1, full, full + 1, 64, 512})


@pytest.mark.parametrize(("qo", "kv"), LAYOUTS)
def test_decode_sweep_stays_inside_the_bound(qo, kv, sm_count):
    nbytes = bound(qo, kv, sm_count)
    buf, pattern = guarded(nbytes)
    workspace = buf[:nbytes]
    gen = torch.Generator().manual_seed(qo * 1000 + kv)
    for batch in batch_sweep(kv, sm_count):
        longest = MAX_MODEL_LEN if 2 * batch * kv <= sm_count else LONGEST_UNSPLIT
        lens = [longest, *torch.randint(1, longest + 1, (batch - 1,), generator=gen).tolist()]
        case = decode_case(qo, kv, lens, seed=batch)
        out = run_xqa(*case, workspace)
        assert torch.equal(buf[nbytes:], pattern), f"batch {batch} wrote past {nbytes} bytes"
        assert not buf[:XQA_SEMAPHORE_BYTES].any(), f"batch {batch} left semaphores set"
        ref = reference(*case)
        err = (out.float() - ref).flatten(1).norm(dim=1) / ref.flatten(1).norm(dim=1)
        assert float(err.max()) < 2e-2, f"batch {batch}: relative error {float(err.max()):.3g}"


@pytest.mark.parametrize(("qo", "kv"), LAYOUTS)
def test_widest_split_writes_the_bound_s_last_bytes(qo, kv, sm_count):
    # One request over the whole table splits into the most sub-sequences there are: its last
    # partial output ends exactly at the bound, and nothing is written after it.
    nbytes = bound(qo, kv, sm_count, batch=1)
    assert nbytes == bound(qo, kv, sm_count)  # batch 1 already needs the most
    buf, pattern = guarded(nbytes)
    case = decode_case(qo, kv, [MAX_MODEL_LEN], seed=7)
    run_xqa(*case, buf[:nbytes])
    assert torch.equal(buf[nbytes:], pattern)
    assert buf[nbytes - 256 : nbytes].any(), "the last partial output was not written"


def test_hopper_fp8_kernel_needs_its_own_layout(sm_count):
    # fp8 KV runs mha_sm90.cu, whose 64-token tiles split a 512-token table 8 ways where
    # mha.cu's 256-token tiles split it 2 ways: it writes past mha.cu's bound, up to the last byte
    # of its own.
    nbytes = bound(40, 8, sm_count, batch=1, max_seq_len=512, hopper_fp8_kv=True)
    mha_only = bound(40, 8, sm_count, batch=1, max_seq_len=512)
    buf, pattern = guarded(nbytes)
    case = decode_case(40, 8, [512], seed=11, width=512, kv_dtype=FP8)
    out = run_xqa(*case, buf[:nbytes])
    assert torch.equal(buf[nbytes:], pattern)
    assert buf[nbytes - 256 : nbytes].any() and buf[mha_only:nbytes].any()
    assert not buf[:XQA_SEMAPHORE_BYTES].any()
    ref = reference(*case)
    err = float((out.float() - ref).norm() / ref.norm())
    assert err < 0.1, f"relative error {err:.3g} (fp8 K/V and query)"


def test_speculative_token_blocks_fill_the_bound(sm_count):
    # 16 drafts x 4 query heads: two token blocks a KV head, each a sequence of its own in the
    # scratch, split as many ways as plain decode (the split count counts requests x KV heads).
    nbytes = bound(32, 8, sm_count, batch=1, q_len_per_req=DRAFTS)
    assert nbytes > bound(32, 8, sm_count, batch=1)
    buf, pattern = guarded(nbytes)
    case = decode_case(32, 8, [MAX_MODEL_LEN], seed=13, q_len=DRAFTS)
    words = -(-DRAFTS // 32) * 2
    mask = torch.full((1, DRAFTS, words), -1, dtype=torch.int16, device="cuda").view(torch.uint16)
    run_xqa(*case, buf[:nbytes], q_len_per_req=DRAFTS, mask=mask)
    assert torch.equal(buf[nbytes:], pattern)
    assert buf[nbytes - 256 : nbytes].any(), "the last token block's partial output is unwritten"
    assert not buf[:XQA_SEMAPHORE_BYTES].any()


def all_visible(batch: int, q_len: int) -> torch.Tensor:
    """XQA's draft mask (uint16 words a row), every draft token seeing every other."""
    words = -(-q_len // 32) * 2
    return torch.full((batch, q_len, words), -1, dtype=torch.int16, device="cuda").view(
        torch.uint16
    )


@pytest.mark.parametrize("kv_dtype", [DTYPE, FP8], ids=["bf16", "fp8"])
@pytest.mark.parametrize("k", SPECULATIVE)
def test_speculative_decode_stays_inside_its_bound_and_overruns_the_one_token_bound(
    k, kv_dtype, sm_count
):
    # 32/8 heads, 1 + k query tokens a request, as vLLM 0.30+ launches XQA with k speculative
    # tokens: the bound for 1 + k holds every batch that splits; the one-token bound is overrun.
    q_len, fp8 = 1 + k, kv_dtype == FP8
    nbytes = bound(32, 8, sm_count, q_len_per_req=q_len, hopper_fp8_kv=fp8)
    one_token = bound(32, 8, sm_count, hopper_fp8_kv=fp8)
    assert nbytes > one_token
    buf, pattern = guarded(nbytes)
    split = sm_count // (2 * 8)
    for batch in sorted({1, 2, split, split + 1}):
        case = decode_case(32, 8, [MAX_MODEL_LEN] * batch, seed=batch, kv_dtype=kv_dtype,
                           q_len=q_len)  # fmt: skip
        out = run_xqa(*case, buf[:nbytes], q_len_per_req=q_len, mask=all_visible(batch, q_len))
        assert torch.equal(buf[nbytes:], pattern), f"batch {batch} wrote past {nbytes} bytes"
        assert not buf[:XQA_SEMAPHORE_BYTES].any(), f"batch {batch} left semaphores set"
        assert bool(out.float().isfinite().all())
    short, pattern = guarded(one_token)
    case = decode_case(32, 8, [MAX_MODEL_LEN], seed=5, kv_dtype=kv_dtype, q_len=q_len)
    run_xqa(*case, short[:one_token], q_len_per_req=q_len, mask=all_visible(1, q_len))
    overrun = int((short[one_token:] != pattern).nonzero().max()) + 1
    print(f"q_len {q_len}, KV {kv_dtype}: {overrun:,} bytes written past the one-token bound "
          f"{one_token:,}; the bound for {q_len} tokens is {nbytes:,}")  # fmt: skip
    assert one_token + overrun <= nbytes


def test_the_check_refuses_a_launch_past_the_workspace_before_the_kernel_runs(sm_count):
    # The workspace at the one-token bound, as a plugin that read no speculative tokens sized
    # it: a launch of 1 + 3 tokens a request is refused and the guard stays as it was; a launch of
    # one token a request runs.
    from flashinfer.decode import xqa_batch_decode_with_kv_cache

    one_token = bound(32, 8, sm_count)
    buf, pattern = guarded(one_token)
    workspace = Workspace(buf[:one_token], "attn.trtllm", floor="resources.attn.trtllm.declared_mb")
    check = TrtllmLaunchCheck(workspace, sm_count)

    def checked_xqa(*args, **kwargs):
        check.check("xqa", args, kwargs)
        return xqa_batch_decode_with_kv_cache(*args, **kwargs)

    scale = 1.0 / math.sqrt(HEAD_DIM)
    q, k, v, table, seq_lens = decode_case(32, 8, [MAX_MODEL_LEN], seed=17, q_len=4)
    with pytest.raises(WorkspaceSealedError) as refused:
        checked_xqa(q, (k, v), workspace.tensor, table, seq_lens, MAX_MODEL_LEN,
                    bmm1_scale=scale, q_len_per_req=4, mask=all_visible(1, 4))  # fmt: skip
    torch.cuda.synchronize()
    assert torch.equal(buf[one_token:], pattern) and not buf[:one_token].any()
    assert refused.value.needed_bytes == bound(32, 8, sm_count, batch=1, q_len_per_req=4)
    q, k, v, table, seq_lens = decode_case(32, 8, [MAX_MODEL_LEN], seed=17)
    checked_xqa(q, (k, v), workspace.tensor, table, seq_lens, MAX_MODEL_LEN, bmm1_scale=scale)
    torch.cuda.synchronize()
    assert torch.equal(buf[one_token:], pattern)
    assert (check.launches, check.refused) == (2, 1)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
