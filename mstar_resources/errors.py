"""The exceptions this library raises: each names the setting to change and the value to give it.

Torch-free, so that composing and checking a config imports no torch. The one error that is also a
torch error, ``WorkspaceGrowthError``, lives beside the workspaces that raise it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "ResourceConfigError",
    "ResourceError",
    "WorkspaceAgreementError",
    "WorkspacePlanError",
    "WorkspaceSealedError",
]


class ResourceError(Exception):
    """Base of every error raised by mstar-resources."""


class ResourceConfigError(ResourceError, ValueError):
    """A setting (config key, argument or environment variable) holds an unusable value."""

    @classmethod
    def listing(cls, problems: list[str], where: str) -> ResourceConfigError:
        """One error for every problem found in ``where`` (e.g. ``the resources config``): the
        problem itself if there is one, else a count and one line each."""
        if len(problems) == 1:
            return cls(problems[0])
        lines = "\n".join(f"  - {problem}" for problem in problems)
        return cls(f"{len(problems)} problems in {where}:\n{lines}")


class WorkspaceSealedError(ResourceError):
    """A plan needs more room than a sealed workspace has; a sealed workspace never moves."""


class WorkspaceAgreementError(ResourceError):
    """The ranks of a group could not agree on a pool at a group seal (they hold different pools,
    or another rank could not grow); raised on every rank, and no rank sealed the pool."""


class WorkspacePlanError(ResourceError):
    """A plan that growing cannot satisfy: its planner does not plan on the workspace's tensor, or
    keeps asking for more."""


def did_you_mean(word: str, options: Iterable[str], prefix: str = "") -> str:
    """`` (did you mean <prefix>X?)`` for the option X closest to a misspelled ``word``, or ""
    if none is close."""
    close = difflib.get_close_matches(word, list(options), n=1)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""
