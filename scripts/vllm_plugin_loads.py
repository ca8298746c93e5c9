"""The vLLM plugin loaded by the installed vLLM's own plugin loader, no GPU needed: each seam's
module imported as vLLM imports it, and each seam found and patched, or said why not.

    pip install --no-deps vllm==0.34.0 dist/mstar_resources-*.whl   # beside vLLM's imports' needs
    python scripts/vllm_plugin_loads.py

Exit status 0 where every seam the installed release has is where the plugin expects it and every
patch took; 1 otherwise (each seam named); 2 where vLLM or the plugin's entry point is not there.
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mstar_resources.integrations.plugin import Seam

LEFT_UNTIL_MADE = {"fast_plan_decode"}
"""Patched when the plugin makes the decode workspace (at vLLM's memory profile), not at import."""


def main() -> int:
    try:
        version = metadata.version("vllm")
    except metadata.PackageNotFoundError:
        print("vLLM is not installed here", file=sys.stderr)
        return 2
    entry = [e.value for e in metadata.entry_points(group="vllm.general_plugins")
             if e.value.startswith("mstar_resources.")]  # fmt: skip
    if not entry:
        print("mstar-resources' vllm.general_plugins entry point is not installed (pip install "
              "the project's wheel beside vLLM)", file=sys.stderr)  # fmt: skip
        return 2
    os.environ.setdefault("MSTAR_RESOURCES_VLLM", "auto")
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # as each of vLLM's processes loads its plugins
    # the plugin as vLLM found it: the installed package, not this checkout
    from mstar_resources.integrations import vllm as plugin
    from mstar_resources.units import release

    state = plugin.active()
    print(f"vLLM {version}; entry point {entry[0]}; plugin active: {state is not None}")
    if state is None:
        return 1
    here = release(version.split("+")[0])
    problems = 0
    for seam in plugin.SEAMS:
        expected = not ((seam.since and here < release(seam.since))
                        or (seam.until and here > release(seam.until)))  # fmt: skip
        note = _seam_note(seam)
        if seam.instance:
            note = "set in __init__ (checked in the wheel's source by engine_seams.py)"
        elif note == "absent" and expected and seam.required:
            note, problems = "MISSING", problems + 1
        elif note == "vLLM's own" and seam.name not in LEFT_UNTIL_MADE:
            note, problems = "NOT PATCHED", problems + 1
        span = ""
        if not expected:
            span = f" (up to {seam.until})" if seam.until else f" (from {seam.since})"
        print(f"  {seam.qualname}: {note}{span}")
    if state.blocked:
        print(f"the plugin left vLLM as it is: {state.blocked}")
        problems += 1
    print(f"{len(plugin.SEAMS)} seams, {problems} problems")
    return 1 if problems else 0


def _seam_note(seam: Seam) -> str:
    """Where ``seam`` is in the running vLLM: absent, found, patched, or vLLM's own."""
    from mstar_resources.integrations.plugin import PATCHED

    try:
        found: Any = importlib.import_module(seam.module)
    except ImportError:
        return "absent"
    for part in seam.name.split("."):
        found = getattr(found, part, None)
    if found is None:
        return "absent"
    if seam.patch is None:
        return "found"
    if isinstance(found, set):  # a set of names the plugin adds its own to
        from mstar_resources.integrations.vllm import ENV_VAR

        return "patched" if ENV_VAR in found else "vLLM's own"
    return "patched" if getattr(found, PATCHED, False) else "vLLM's own"


if __name__ == "__main__":
    sys.exit(main())
