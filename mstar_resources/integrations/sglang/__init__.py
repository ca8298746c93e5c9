"""SGLang's FlashInfer workspaces from this library (docs/sglang.md).

SGLang loads :func:`register` (entry point ``sglang.srt.plugins``) in each of its processes; it
does nothing unless ``MSTAR_RESOURCES_SGLANG`` is set (:mod:`.setting`). Enabled, in each process
that builds a model (:mod:`.seams` patches SGLang, :mod:`.workspaces` holds the workspaces):

1. before ``ModelRunner.alloc_memory_pool`` sizes the KV pool from the memory left, it makes the
   prefill and decode workspaces and stores the decode one in SGLang's buffer registry under
   ``flashinfer_workspace``, which SGLang's FlashInfer backend takes as it is (so its own
   ``SGLANG_FLASHINFER_WORKSPACE_SIZE`` buffer is never made);
2. each ``FlashInferAttnBackend``'s prefill wrappers move to the prefill workspace, and every plan
   on either (``begin_forward``, ``fast_decode_plan``) goes through :meth:`Workspace.plan`;
3. before ``ModelRunner.init_cuda_graphs`` (called also where none is captured) the pools are
   sealed.

A release older than :data:`READ_IN`'s first is not served, and one that lacks a seam is left as
it is, the seam named; so is a failure of the plugin's own. A backend that makes a workspace of
its own (``init_new_workspace``: speculative workers) keeps it, with a WARNING.
"""

from __future__ import annotations

from .seams import PLUGIN, READ_IN, SEAMS, active, missing_seams, register, version_problem
from .setting import ENV_VAR, SGLANG

__all__ = [
    "ENV_VAR",
    "PLUGIN",
    "READ_IN",
    "SEAMS",
    "SGLANG",
    "active",
    "missing_seams",
    "register",
    "version_problem",
]
