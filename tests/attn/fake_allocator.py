"""A fake FlashInfer planner for the CPU tests, failing exactly as FlashInfer's allocator does.

Its error text is not written out here: it is rendered from ``flashinfer_overflow.json``, which
holds FlashInfer's own C++ stream expressions (``allocator.h`` for the message, ``exception.h`` for
the prefix) parsed into literals and variables, with their lines. So the CPU tests need no
FlashInfer, and test_overflow.py checks the fixture against the installed FlashInfer's headers
wherever FlashInfer is installed: a release that changes the text fails there instead of silently
turning growth off.
"""

from __future__ import annotations

import ast
import functools
import json
import re
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mstar_resources.testing import flashinfer_overflow

from ..flashinfer_sources import flashinfer_package

FIXTURE = Path(__file__).parents[2] / "mstar_resources" / "attn" / "flashinfer_overflow.json"
"""Shipped in the package: ``mstar_resources.testing`` renders FlashInfer's overflow from it."""

# Where a FlashInfer wheel keeps its headers, inside the package; its JIT builds compile them from
# there, so that is the path (``__FILE__``) its errors name.
HEADERS = Path("data/include/flashinfer")


def installed_flashinfer_file(expression: dict[str, Any]) -> Path | None:
    """The file of FlashInfer a fixture expression comes from (a header, or a Python
    ``source``): the installed package's, else the downloaded wheel's
    (:mod:`tests.flashinfer_sources`); None where there is neither."""
    package = flashinfer_package()
    if package is None:
        return None
    if "source" in expression:
        return package / expression["source"]
    return package / HEADERS / expression["header"]


def header_file(name: str) -> str:
    """The path an error names for header ``name``: where a FlashInfer wheel installed in this
    environment keeps it (whether or not one is installed)."""
    return str(Path(sysconfig.get_path("purelib")) / "flashinfer" / HEADERS / name)


# The statement right after an expression that throws it: its line is the one the error names.
_THROW = re.compile(r"\s*(FLASHINFER_ERROR)\s*\(\s*oss\.str\(\)\s*\)")


@dataclass(frozen=True)
class StreamText:
    """A C++ ``oss << "literal" << variable << ...;`` expression, rendered from Python values."""

    parts: tuple[tuple[bool, str], ...]  # (is_variable, literal text or variable name)
    line: int
    """Where the expression begins in its header."""
    throw_line: int | None
    """Where the ``FLASHINFER_ERROR(oss.str())`` right after it throws the text, if one does:
    the ``__LINE__`` its error reports. None where the text is not thrown there."""

    @classmethod
    def parse(cls, text: str, opening: str) -> StreamText:
        """The first expression in header ``text`` whose first literal starts with ``opening``."""
        match = re.search(r'oss\s*<<\s*("' + re.escape(opening) + r".*?);", text, re.S)
        if match is None:
            raise LookupError(f'no `oss << "{opening}...` expression')
        parts = []
        for piece in (p.strip() for p in match[1].split("<<")):
            literals = re.findall(r'"(?:[^"\\]|\\.)*"', piece)
            if literals:  # adjacent literals concatenate, as in C++
                parts.append((False, "".join(ast.literal_eval(s) for s in literals)))
            else:
                parts.append((True, piece))
        thrown = _THROW.match(text, match.end())
        return cls(
            parts=tuple(parts),
            line=_line_at(text, match.start()),
            throw_line=None if thrown is None else _line_at(text, thrown.start(1)),
        )

    @classmethod
    def parse_fstring(cls, text: str, opening: str) -> StreamText:
        """The first f-string in Python ``text`` with a literal part that contains ``opening``
        and a formatted value; its line, and no throw line (a Python error names none)."""
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.JoinedStr):
                continue
            parts = tuple(
                (True, ast.unparse(value.value))
                if isinstance(value, ast.FormattedValue)
                else (False, str(value.value))  # type: ignore[attr-defined]
                for value in node.values
            )
            if any(not var and opening in value for var, value in parts):
                return cls(parts=parts, line=node.lineno, throw_line=None)
        raise LookupError(f"no f-string with {opening!r}")

    @classmethod
    def find(cls, path: Path, opening: str) -> StreamText:
        """The expression in a header, or the f-string in a Python source."""
        parse = cls.parse_fstring if path.suffix == ".py" else cls.parse
        try:
            return parse(path.read_text(), opening)
        except LookupError as error:
            raise AssertionError(f"{path}: {error}") from None

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> StreamText:
        parts = []
        for part in record["parts"]:
            ((kind, value),) = part.items()
            if kind not in ("literal", "variable"):
                raise ValueError(f"{FIXTURE.name}: a part is a literal or a variable, not {part}")
            parts.append((kind == "variable", value))
        return cls(tuple(parts), record["line"], record.get("throw_line"))

    def record(self) -> dict[str, Any]:
        """The fields the fixture holds for this expression, as it holds them."""
        return {
            "line": self.line,
            "throw_line": self.throw_line,
            "parts": [{"variable" if var else "literal": value} for var, value in self.parts],
        }

    @property
    def variables(self) -> set[str]:
        return {value for is_variable, value in self.parts if is_variable}

    def render(self, **values: object) -> str:
        return "".join(str(values[v]) if is_var else v for is_var, v in self.parts)


def _line_at(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


@functools.cache
def fixture() -> dict[str, Any]:
    """FlashInfer's overflow text as the fixture holds it: the version and commits it was taken
    from, and under ``expressions`` each expression's header, opening, lines and parts."""
    return json.loads(FIXTURE.read_text())


def fixture_expression(key: str) -> dict[str, Any]:
    return fixture()["expressions"][key]


def overflow_text() -> StreamText:
    return StreamText.from_record(fixture_expression("overflow"))


def error_prefix_text() -> StreamText:
    return StreamText.from_record(fixture_expression("error_prefix"))


def flashinfer_overflow_message(name: str, size: int, alignment: int, available: int) -> str:
    """The text FlashInfer's allocator throws for this overflow, prefix included: the library's
    own rendering (``mstar_resources.testing``), the one the tests and an engine's tests share."""
    return str(flashinfer_overflow(name, size, available, alignment))


def mla_preflight_message(backend: str, required_bytes: int) -> str:
    """The ``ValueError`` text of MLA's ``fa2``/``fa3`` check before they plan (0.7.4)."""
    text = StreamText.from_record(fixture_expression("mla_preflight"))
    values = {"cls._plan_capabilities.backend_name": backend, "required_bytes": required_bytes}
    return text.render(**values)


@dataclass
class FakePlanner:
    """Plans a fixed chain of allocations in ``buffer`` as ``AlignedAllocator`` would, and raises
    its error on the first that does not fit. Holds the tensor itself, as FlashInfer's wrappers do,
    so it sees a workspace grow only if the tensor object grows in place."""

    buffer: torch.Tensor
    allocations: list[tuple[str, int, int]]  # (name, size, alignment)
    mla_backend: str | None = None
    """Check the whole buffer first, as MLA's ``fa2``/``fa3`` backends do (0.7.4), and raise
    their ``ValueError`` naming this backend if it is short."""
    calls: int = 0
    offsets: dict[str, int] = field(default_factory=dict)

    def __call__(self, *args: object, **kwargs: object) -> tuple[tuple[object, ...], dict]:
        self.calls += 1
        if self.mla_backend is not None and self.buffer.numel() < self.bytes_needed():
            raise ValueError(mla_preflight_message(self.mla_backend, self.bytes_needed()))
        taken, available = 0, self.buffer.numel()
        for name, size, alignment in self.allocations:
            padding = -taken % alignment
            if padding + size > available:
                raise RuntimeError(flashinfer_overflow_message(name, size, alignment, available))
            self.offsets[name] = taken + padding
            taken += padding + size
            available -= padding + size
        return args, kwargs

    plan = __call__

    def workspace_size(self, *args: object, **kwargs: object) -> tuple[int, int]:
        """As FlashInfer's wrappers answer it: (float bytes, int bytes), planning nothing."""
        return self.bytes_needed(), 0

    def bytes_needed(self) -> int:
        taken = 0
        for _, size, alignment in self.allocations:
            taken += -taken % alignment + size
        return taken


class FakePrefillWrapper:
    """Records its float buffer's size when it is built, as FlashInfer's paged prefill wrapper
    does (``_workspace_size``), and plans through a FakePlanner on that buffer."""

    def __init__(self, buffer: torch.Tensor, allocations: list[tuple[str, int, int]]) -> None:
        self._float_workspace_buffer = buffer
        self._workspace_size = buffer.numel() * buffer.element_size()
        self._planner = FakePlanner(buffer, allocations)

    def plan(self, *args: object, **kwargs: object) -> tuple[tuple[object, ...], dict]:
        return self._planner(*args, **kwargs)


def _decorated(method: Any) -> Any:
    @functools.wraps(method)
    def decorated(*args: object, **kwargs: object) -> Any:
        return method(*args, **kwargs)

    return decorated


class FakeWrapper:
    """Keeps its buffers as FlashInfer's attention wrappers do: the float workspace it is built
    on, and an int workspace with a host mirror of its own (``_int_workspace_buffer``,
    ``_pin_memory_int_workspace_buffer``). Its plan allocates ``int_allocations`` from the int
    buffer (the allocator sized by it, as FlashInfer's), writes each to the mirror at the same
    offset, then allocates ``float_allocations`` from the float buffer."""

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        int_allocations: list[tuple[str, int, int]] = (),  # type: ignore[assignment]
        float_allocations: list[tuple[str, int, int]] = (),  # type: ignore[assignment]
        int_bytes: int = 1 << 16,
    ) -> None:
        self._float_workspace_buffer = float_workspace_buffer
        self._int_workspace_buffer = torch.empty(int_bytes, dtype=torch.uint8)
        self._pin_memory_int_workspace_buffer = torch.empty(int_bytes, dtype=torch.uint8)
        self.int_allocations = list(int_allocations)
        self.float_allocations = list(float_allocations)
        self.plans = 0

    def plan(self, *args: object, **kwargs: object) -> None:
        self.plans += 1
        FakePlanner(self._int_workspace_buffer, self.int_allocations)()
        mirror = self._pin_memory_int_workspace_buffer
        end = FakePlanner(self._int_workspace_buffer, self.int_allocations).bytes_needed()
        # FlashInfer never checks the mirror's size: a short one would be overrun on the host.
        assert mirror.numel() >= end, "the plan wrote past its host mirror"
        mirror[:end] = self.plans % 251
        FakePlanner(self._float_workspace_buffer, self.float_allocations)()

    @_decorated  # as FlashInfer 0.7 decorates run() (flashinfer_api): it has a __wrapped__
    def run(self, *args: object, **kwargs: object) -> str:
        assert isinstance(self, FakeWrapper), "run() was called unbound"
        return "ran with lse" if kwargs.get("return_lse") else "ran"

    # As FlashInfer's wrappers define it (0.6 and 0.7): the class's own run, bound at its making.
    run_return_lse = functools.partialmethod(run, return_lse=True)

    def workspace_size(self, *args: object, **kwargs: object) -> tuple[int, int]:
        return (
            FakePlanner(self._float_workspace_buffer, self.float_allocations).bytes_needed(),
            FakePlanner(self._int_workspace_buffer, self.int_allocations).bytes_needed(),
        )
