"""vLLM's FlashInfer workspaces from this library (docs/vllm.md).

vLLM loads :func:`register` (entry point ``vllm.general_plugins``) in each of its processes; it
does nothing unless ``MSTAR_RESOURCES_VLLM`` is set (:mod:`.setting`). Enabled, in each worker
(:mod:`.seams` patches vLLM, :mod:`.workspaces` holds the workspaces):

1. at ``profile_run`` (V1 and V2 runners) it makes vLLM's FlashInfer metadata builders on the CPU,
   reads what each will run (:mod:`.plans`), and makes a workspace for each phase that runs on
   native wrappers, and vLLM's TRT-LLM workspace where one runs TRT-LLM's kernels, so that vLLM's
   profile counts them;
2. ``FlashInferMetadataBuilder._get_workspace_buffer`` hands each wrapper its phase's workspace,
   and every plan goes through :meth:`Workspace.plan`;
3. before ``capture_model`` (not 0.33's profiling capture), or after the warm-up where no graph
   is captured, the pools are sealed.

A release older than :data:`READ_IN`'s first is not served, and one that lacks a seam is left as
it is, the seam named; so is a model whose attention is not FlashInfer's plain backend, and a
failure of the plugin's own. A bad setting ends vLLM's start with status 2.
"""

from __future__ import annotations

from ..plugin import Seam
from .plans import plans_of_groups
from .seams import PLUGIN, READ_IN, SEAMS, active, missing_seams, register, version_problem
from .setting import ENV_VAR, Setting, read_setting
from .workspaces import VllmWorkspaces

__all__ = [
    "ENV_VAR",
    "PLUGIN",
    "READ_IN",
    "SEAMS",
    "Seam",
    "Setting",
    "VllmWorkspaces",
    "active",
    "missing_seams",
    "plans_of_groups",
    "read_setting",
    "register",
    "version_problem",
]
