"""vLLM's FlashInfer workspaces from this library: sized by a deployment or measured in the worker,
reserved before vLLM sizes its KV cache, and sealed before it serves.

vLLM loads the entry point ``mstar_resources`` of the group ``vllm.general_plugins`` in each of its
processes (:func:`register`). It does nothing unless ``MSTAR_RESOURCES_VLLM`` is set
(:mod:`.setting`):

- ``MSTAR_RESOURCES_VLLM=auto``: each worker measures vLLM's own plans on its GPU and its
  FlashInfer before vLLM sizes its KV cache;
- ``MSTAR_RESOURCES_VLLM=<deployment>``: the floors of a shipped deployment (its calibrated
  override, e.g. ``llama3-8b-h200_calibrated``), else ``MSTAR_WORKSPACE_BUFFER_MB``, else 512 MB;
- ``MSTAR_RESOURCES_VLLM=/path/to/deployment/<name>.yaml``: a deployment file of the user's (one
  ``mstar-resources-calibrate`` wrote, say), composed over the shipped tree.

Enabled, in each worker (:mod:`.seams` patches vLLM; :mod:`.workspaces` holds the workspaces):

1. When vLLM starts its memory profile (``profile_run``, V1 and V2 runners), the plugin makes
   vLLM's FlashInfer metadata builders as vLLM will, on the CPU, and reads what each will run
   (:mod:`.plans`: per KV-cache group, its heads, page size, each phase's query dtype and kernel:
   FlashInfer's native wrappers, TRT-LLM's XQA or trtllm-gen). It makes a workspace for each phase
   that runs on native wrappers, and vLLM's own TRT-LLM workspace where a phase runs TRT-LLM's
   kernels, so vLLM's profile counts them when it sizes the KV cache.
2. vLLM's ``FlashInferMetadataBuilder`` builds every wrapper lazily on ``_get_workspace_buffer()``:
   the prefill wrappers get the ``prefill`` workspace, the decode wrappers (one per CUDA-graph
   batch size, and the eager one) the ``decode`` workspace, and vLLM's own buffer is never made.
   Each plan goes through :meth:`Workspace.plan`: a plan that overflows grows its workspace, and a
   plan after the seal that does not fit raises :class:`~mstar_resources.WorkspaceSealedError`,
   naming the setting to raise.
3. Before vLLM captures CUDA graphs (``capture_model``, except 0.33's profiling capture), or, where
   it captures none (``enforce_eager``), after its warm-up and before its first request, the pools
   are sealed.

The releases it serves (:data:`READ_IN`, read in their wheels; :func:`version_problem`): every
release from the first read, a release not read served where each seam it needs is there (one
line says so), and one that lacks a seam left as it is, the seam named. On a model whose
attention is not FlashInfer's, or FlashInfer's MLA backend, the plugin logs one WARNING saying
what and why and leaves vLLM as it is; so does a failure of its own. A bad setting ends vLLM's
start with one paragraph naming the setting and its value, and status 2.
"""

from __future__ import annotations

from ..plugin import Seam
from .plans import ROLES, BuilderPlans, Role, builder_plans, plans_of_groups
from .seams import PLUGIN, READ_IN, SEAMS, active, missing_seams, register, version_problem
from .setting import AUTO, ENV_VAR, Setting, read_setting
from .workspaces import VllmWorkspaces

__all__ = [
    "AUTO",
    "ENV_VAR",
    "PLUGIN",
    "READ_IN",
    "ROLES",
    "SEAMS",
    "BuilderPlans",
    "Role",
    "Seam",
    "Setting",
    "VllmWorkspaces",
    "active",
    "builder_plans",
    "missing_seams",
    "plans_of_groups",
    "read_setting",
    "register",
    "version_problem",
]
