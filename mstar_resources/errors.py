"""The exceptions this library raises: each names the setting to change and the value to give it,
and carries its figures as fields, so an engine reads fields, never the wording."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "Problem", "ResourceConfigError", "ResourceError", "ResourceUsageError",
    "WorkspaceAgreementError", "WorkspacePlanError", "WorkspaceSealedError", "WorkspaceShortError"
]  # fmt: skip


class ResourceError(Exception):
    """Base of every error raised by mstar-resources: a message, and its fields as keywords. A
    pickled copy is built from its message alone, its fields set after (as for any exception)."""

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.__dict__.update(fields)


class Problem(str):
    """One problem of a setting: a ``str``, the sentence a person reads, with its parts as fields:
    ``setting``, the key, argument or variable holding the bad value (None where the problem is no
    one setting's); ``value``, what it holds; ``expects``, what it takes, in words; ``fix``, what to
    do where the sentence says more than "give it what it takes"."""

    setting: str | None
    value: object
    expects: str | None
    fix: str | None

    def __new__(
        cls,
        text: str,
        *,
        setting: str | None = None,
        value: object = None,
        expects: str | None = None,
        fix: str | None = None,
    ) -> Problem:
        problem = super().__new__(cls, text)
        problem.setting, problem.value, problem.expects, problem.fix = setting, value, expects, fix
        return problem

    def under(self, prefix: str) -> Problem:
        """This problem with ``prefix`` (``resources.attn.decode.``) before sentence and setting."""
        setting = None if self.setting is None else prefix + self.setting
        return Problem(prefix + self, **{**vars(self), "setting": setting})


MAX_PROBLEMS_SHOWN = 20  # listed in the text; the problems field holds all


class _ProblemsError(ResourceError, ValueError):
    """An error told as the problems found, one sentence each (a :class:`Problem`)."""

    problems: tuple[Problem, ...]
    where: str

    def __init__(self, *problems: str, where: str = "the config") -> None:
        self.problems = tuple(p if isinstance(p, Problem) else Problem(p) for p in problems)
        self.where = where
        if len(problems) == 1:
            text = problems[0]
        else:
            shown = problems[:MAX_PROBLEMS_SHOWN]
            lines = "\n".join(f"  - {problem}" for problem in shown)
            if more := len(problems) - len(shown):  # all of them stay in ``problems``
                lines += f"\n  - ... and {more:,} more, each like those above"
            text = f"{len(problems):,} problems in {where}:\n{lines}"
        super().__init__(text)


class ResourceConfigError(_ProblemsError):
    """A setting (config key, argument or environment variable) holds an unusable value.
    ``problems``: one :class:`Problem` each, in the order found; ``where``: what was checked (``the
    resources config``). The text is the problem when there is one, else a count and a line each."""


class ResourceUsageError(_ProblemsError):
    """An argument of the library's API that the calling code got wrong (a wrapper on another
    buffer, a key its pool does not serve), not a config: ``except ResourceConfigError`` lets it
    through with its traceback. Fields as :class:`ResourceConfigError`'s."""


class WorkspaceShortError(ResourceError):
    """A workspace that had fewer bytes than it needed. Fields: ``workspace`` (its name),
    ``held_bytes``, ``needed_bytes`` and ``setting`` (the one that sizes its floor)."""

    workspace: str
    held_bytes: int
    needed_bytes: int
    setting: str


class WorkspaceSealedError(WorkspaceShortError):
    """A plan needs more room than a sealed workspace has; a sealed workspace never moves.
    Fields: those of :class:`WorkspaceShortError` (``needed_bytes`` as far as FlashInfer said), and
    ``suggested_mb``, the value of ``setting`` that holds ``needed_bytes``."""

    suggested_mb: int


class WorkspaceAgreementError(ResourceError):
    """The ranks of a group could not agree on a pool at a group seal (they hold different pools, or
    another rank could not grow); raised on every rank, and no rank sealed the pool. Fields:
    ``ranks`` (the ranks concerned: every rank when the pools differ, else those that failed),
    ``reasons`` (by each of those ranks: the pool it seals, or how it failed), ``held`` (by every
    rank of the group: the bytes of each workspace it held, by (label, slot)) and ``errors`` (by
    each rank that failed: the error it raised, whole, with its fields)."""

    ranks: tuple[int, ...]
    reasons: dict[int, str]
    held: dict[int, dict[tuple[str, int | None], int]]
    errors: dict[int, Exception]

    def __init__(
        self,
        message: str,
        *,
        reasons: Mapping[int, str] | None = None,
        held: Mapping[int, Mapping[tuple[str, int | None], int]] | None = None,
        errors: Mapping[int, Exception] | None = None,
    ) -> None:  # each field optional, so pickle can rebuild it from its message
        super().__init__(message)
        self.reasons = dict(reasons or {})
        self.ranks = tuple(sorted(self.reasons))
        self.held = {rank: dict(sizes) for rank, sizes in (held or {}).items()}
        self.errors = dict(errors or {})


class WorkspacePlanError(ResourceError):
    """A plan that growing cannot satisfy: its planner does not plan on the workspace's tensor, or
    keeps asking for more. Fields: ``workspace`` (its name) and ``held_bytes``."""

    workspace: str
    held_bytes: int


def did_you_mean(word: str, options: Iterable[str], prefix: str = "") -> str:
    """`` (did you mean <prefix>X?)`` for the option closest to ``word``, or "" if none is."""
    close = difflib.get_close_matches(word, list(options), n=1)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def check_argument(
    name: str, value: object, expected: type | tuple[type, ...], expects: str
) -> None:
    """Raise :class:`ResourceUsageError` unless ``value`` is an ``expected``."""
    if not isinstance(value, expected):
        text = f"{name}={value!r} must be {expects}"
        raise ResourceUsageError(Problem(text, setting=name, value=value, expects=expects))


def check_name(setting: str, value: object, must: str, where: str = "") -> None:
    """Raise :class:`ResourceUsageError` (after ``where``) unless ``value`` is a usable name."""
    if not isinstance(value, str) or not value.strip():
        raise ResourceUsageError(f"{where}{setting}={value!r} {must}")
    if (problem := name_problem(setting, value)) is not None:
        raise ResourceUsageError(where + problem)


MAX_NAME = 128  # characters of an owner or a label: tables, logs and errors print each


def name_problem(setting: str, value: str) -> str | None:
    """What is wrong with ``value``, a non-blank name of ``setting`` that tables and logs print."""
    if len(value) > MAX_NAME:
        return (
            f"{setting} has {len(value):,} characters ({value[:20]!r}...); a name has at most "
            f"{MAX_NAME}"
        )
    if value != value.strip():
        return (
            f"{setting}={value!r} has spaces at its ends, which would make it another name than "
            f"{value.strip()!r}; write it without them"
        )
    if not value.isprintable():
        bad = next(c for c in value if not c.isprintable())
        return (
            f"{setting}={value!r} holds the control character {bad!r}, which would break the "
            "tables and logs that print it; use letters, digits and punctuation"
        )
    return None
