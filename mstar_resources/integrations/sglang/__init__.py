"""SGLang's FlashInfer workspace from this library: sized by a deployment, reserved before SGLang
sizes its KV pool, every plan through :meth:`Workspace.plan`, sealed before SGLang captures CUDA
graphs.

SGLang loads the entry point ``mstar_resources`` of its group ``sglang.srt.plugins`` in each of
its processes (:func:`register`). It does nothing unless ``MSTAR_RESOURCES_SGLANG`` is set
(:mod:`.setting`) to a shipped deployment (``llama3-8b-h200_calibrated``) or the path of a
deployment file (one ``mstar-resources-calibrate`` wrote).

Enabled, in each process that builds a model (:mod:`.seams` patches SGLang; :mod:`.workspaces`
holds the workspaces):

1. Before SGLang sizes its KV pool (``ModelRunner.alloc_memory_pool``, which sizes it from the
   GPU memory left under ``mem_fraction_static``), the plugin makes the prefill and the decode
   workspaces at their floors and stores the decode one in SGLang's buffer registry under
   ``flashinfer_workspace``. SGLang's FlashInfer backend takes a buffer stored there as it is,
   so its own size (``SGLANG_FLASHINFER_WORKSPACE_SIZE``, which it replaces with 512 MiB for
   Qwen2, Qwen3, MiMo and Qwen3-VL models and with 2 GiB in deterministic mode) is never
   allocated.
2. As SGLang builds each ``FlashInferAttnBackend``, its prefill wrappers (ragged, paged, verify)
   move to the prefill workspace; its decode wrappers, and those it makes for each CUDA graph,
   stay on the decode one. Each plan of a wrapper on one of them (FlashInfer's
   ``begin_forward``, SGLang's ``fast_decode_plan``) goes through :meth:`Workspace.plan`. The
   wrappers keep their own int workspaces: SGLang plans several before it runs any.
3. Before SGLang captures CUDA graphs (``ModelRunner.init_cuda_graphs``, also called when it
   captures none) the pools are sealed: a plan after that which does not fit raises
   :class:`~mstar_resources.WorkspaceSealedError`, naming the setting to raise and to what.

The releases it serves (:data:`READ_IN`, read in their wheels; :func:`version_problem`): every
release from the first read, a release not read served where each seam it needs is there (one
line says so), and one that lacks a seam left as it is, with one WARNING naming the seam; so is
a failure of its own. A backend
that makes a workspace of its own (``init_new_workspace``: speculative workers) keeps it, with a
WARNING.
"""

from __future__ import annotations

from .seams import PLUGIN, READ_IN, SEAMS, active, missing_seams, register, version_problem
from .setting import ENV_VAR, ROLES, SGLANG
from .workspaces import BUFFER_NAME, SglangWorkspaces

__all__ = [
    "BUFFER_NAME",
    "ENV_VAR",
    "PLUGIN",
    "READ_IN",
    "ROLES",
    "SEAMS",
    "SGLANG",
    "SglangWorkspaces",
    "active",
    "missing_seams",
    "register",
    "version_problem",
]
