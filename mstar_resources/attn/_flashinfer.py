"""Every name of FlashInfer's private surface this library relies on (its wrappers' private
attributes, a private exception type, the installed headers), each with the versions it was read
in: a FlashInfer bump means re-reading this module and ``_overflow.py``. It imports neither
FlashInfer nor, at import, torch: calibration's torch-free checks read the headers through it."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..units import is_int

if TYPE_CHECKING:
    import torch

FLOAT_BUFFER = "_float_workspace_buffer"
"""Where a wrapper keeps the float workspace it was built on. Read in 0.6.6, 0.7.2.post1 and 0.7.4:
decode, paged and ragged prefill, POD and MLA wrappers; each plan and run reads it as it is then,
which is what lets a workspace grow in place."""

INT_BUFFER = "_int_workspace_buffer"
HOST_MIRROR = "_pin_memory_int_workspace_buffer"
"""Where a wrapper keeps its int workspace and that buffer's host mirror (8 MiB each, made by the
wrapper itself, the mirror pinned). Read in 0.6.6, 0.7.2.post1 and 0.7.4: decode, paged and ragged
prefill, POD; MLA in 0.6, and in 0.7 only once a plan made a fresh pair (so 0.7's MLA keeps its
own). A cascade wrapper keeps none (one per level, in wrappers of its own)."""

RECORDED_SIZE = "_workspace_size"
"""The float workspace's size in bytes, as FlashInfer's paged prefill wrapper records it once, at
construction (0.6.6, 0.7.4); its run hands the figure to the ``trtllm-gen`` backend, which bounds
its scratch by it. The decode wrapper reads the tensor's size at each plan instead."""

XQA_DECODE_RUN = "_use_xqa_mtp_decode"
XQA_DECODE_RUN_NAME = "XQA's decode run"
"""Set by the decode wrapper's plan where its run will launch XQA on the float workspace, its 8 MiB
of semaphores then scratch, with no check of the workspace's size (0.7.4, not 0.7.2.post1: tensor
cores, backend ``auto``, several query tokens a request, under CUDA graphs, for the shapes it
measured faster). The plan also leaves ``_batch_size``, ``_num_qo_heads``, ``_num_kv_heads``,
``_block_tables``, ``_xqa_mtp_q_len_per_req`` and ``_cached_kv_data_type``, and takes ``head_dim``
and ``page_size`` by those names, as vLLM's ``fast_plan_decode`` does."""

REFUSAL = ("flashinfer.mla._batch_mla._backends._capabilities", "_BackendPlanUnsupportedError")
"""The module and name of FlashInfer's refusal to plan a shape: a ``ValueError`` its MLA backends
raise for a shape they cannot run (0.7.4; 0.6.6 has none, and refuses nothing calibration takes)."""

_GROUP_DISPATCH = re.compile(r"#define DISPATCH_GQA_GROUP_SIZE\b(?P<body>.*?)\n\s*\n", re.S)
_GROUP_CASE = re.compile(r"group_size == (\d+)")
"""``DISPATCH_GQA_GROUP_SIZE`` in ``flashinfer/utils.cuh``: the GQA group sizes the plain decode
kernels are compiled for, one ``group_size == N`` case each (0.6.6, 0.7.4)."""


def own_buffers(wrapper: Any) -> dict[str, Any] | None:
    """``wrapper``'s attributes, where it keeps an int workspace and host mirror, else None."""
    import torch

    own = getattr(wrapper, "__dict__", None) or {}
    buffers = own.get(INT_BUFFER), own.get(HOST_MIRROR)
    return own if all(isinstance(buffer, torch.Tensor) for buffer in buffers) else None


def buffer_views(wrapper: Any, tensor: torch.Tensor) -> list[str]:
    """The attributes of ``wrapper`` holding a view of ``tensor``'s memory other than ``tensor``
    itself, which growth would leave on the old block ([] on the meta device: no memory)."""
    import torch

    if tensor.device.type == "meta":
        return []
    start = tensor.untyped_storage().data_ptr()
    end = start + tensor.untyped_storage().nbytes()
    return [
        name
        for name, value in (getattr(wrapper, "__dict__", None) or {}).items()
        if isinstance(value, torch.Tensor)
        and value is not tensor
        and value.device == tensor.device
        and start <= value.untyped_storage().data_ptr() < end
    ]


def refresh_recorded_size(attributes: dict[str, Any], tensor: torch.Tensor, size: int) -> None:
    """Set a wrapper's :data:`RECORDED_SIZE` to ``size``, ``tensor``'s, where it plans on it."""
    if is_int(attributes.get(RECORDED_SIZE)) and attributes.get(FLOAT_BUFFER) is tensor:
        attributes[RECORDED_SIZE] = size


def refusals() -> tuple[type[BaseException], ...]:
    """The installed FlashInfer's :data:`REFUSAL` type, if it has one."""
    module, name = REFUSAL
    try:
        refusal = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return ()
    return (refusal,) if isinstance(refusal, type) and issubclass(refusal, ValueError) else ()


def plain_decode_groups(headers: Path | None = None) -> frozenset[int] | None:
    """The GQA group sizes FlashInfer's plain decode kernels are compiled for, read from
    ``headers`` (default: the installed FlashInfer's, not imported); None where unreadable."""
    if headers is None:
        spec = importlib.util.find_spec("flashinfer")
        if spec is None or not spec.submodule_search_locations:
            return None
        # Where the package keeps its CUDA headers (0.6.6, 0.7.4).
        headers = Path(next(iter(spec.submodule_search_locations))) / "data" / "include"
    try:
        text = (headers / "flashinfer" / "utils.cuh").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    macro = _GROUP_DISPATCH.search(text)
    groups = frozenset(int(n) for n in _GROUP_CASE.findall(macro["body"])) if macro else None
    return groups or None
