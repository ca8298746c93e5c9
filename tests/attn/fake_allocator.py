"""A fake FlashInfer planner for the CPU tests, failing exactly as FlashInfer's allocator does.

Its error text is not copied here: it is rebuilt from the installed FlashInfer's own C++ headers
(``allocator.h`` for the message, ``exception.h`` for the prefix), so a FlashInfer release that
changes the text fails these tests instead of silently turning growth off.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch


def flashinfer_header(name: str) -> Path:
    """A header of the installed FlashInfer, found without importing it (no CUDA needed)."""
    spec = importlib.util.find_spec("flashinfer")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("FlashInfer is not installed: pip install -e '.[test]'")
    return Path(next(iter(spec.submodule_search_locations))) / "data/include/flashinfer" / name


@dataclass(frozen=True)
class StreamText:
    """A C++ ``oss << "literal" << variable << ...`` expression, rendered from Python values."""

    parts: tuple[tuple[bool, str], ...]  # (is_variable, literal text or variable name)
    source: str
    line: int

    @classmethod
    def find(cls, header: Path, opening: str) -> StreamText:
        text = header.read_text()
        match = re.search(r'oss\s*<<\s*("' + re.escape(opening) + r".*?);", text, re.S)
        if match is None:
            raise AssertionError(f'{header}: no `oss << "{opening}...` expression')
        parts = []
        for piece in (p.strip() for p in match[1].split("<<")):
            literals = re.findall(r'"(?:[^"\\]|\\.)*"', piece)
            if literals:  # adjacent literals concatenate, as in C++
                parts.append((False, "".join(ast.literal_eval(s) for s in literals)))
            else:
                parts.append((True, piece))
        line = text.count("\n", 0, match.start()) + 1
        return cls(tuple(parts), str(header), line)

    @property
    def variables(self) -> set[str]:
        return {value for is_variable, value in self.parts if is_variable}

    def render(self, **values: object) -> str:
        return "".join(str(values[v]) if is_var else v for is_var, v in self.parts)


def overflow_text() -> StreamText:
    return StreamText.find(flashinfer_header("allocator.h"), "Buffer overflow")


def error_prefix_text() -> StreamText:
    return StreamText.find(flashinfer_header("exception.h"), "Error in function")


def flashinfer_overflow_message(name: str, size: int, alignment: int, available: int) -> str:
    """The text FlashInfer's allocator throws for this overflow, prefix included."""
    overflow = overflow_text()
    message = overflow.render(name=name, size=size, alignment=alignment, remaining_space=available)
    return error_prefix_text().render(
        func="aligned_alloc", file=overflow.source, line=overflow.line, message=message
    )


def legacy_overflow_message(name: str, size: int, alignment: int) -> str:
    """The text of FlashInfer before 0.2.9, which did not say how many bytes were left."""
    return (
        f"Failed to allocate memory for {name} with size {size} and alignment {alignment} "
        "in AlignedAllocator"
    )


@dataclass
class FakePlanner:
    """Plans a fixed chain of allocations in ``buffer`` as ``AlignedAllocator`` would, and raises
    its error on the first that does not fit. Holds the tensor itself, as FlashInfer's wrappers do,
    so it sees a workspace grow only if the tensor object grows in place."""

    buffer: torch.Tensor
    allocations: list[tuple[str, int, int]]  # (name, size, alignment)
    legacy: bool = False
    calls: int = 0
    offsets: dict[str, int] = field(default_factory=dict)

    def __call__(self, *args: object, **kwargs: object) -> tuple[tuple[object, ...], dict]:
        self.calls += 1
        taken, available = 0, self.buffer.numel()
        for name, size, alignment in self.allocations:
            padding = -taken % alignment
            if padding + size > available:
                raise RuntimeError(
                    legacy_overflow_message(name, size, alignment)
                    if self.legacy
                    else flashinfer_overflow_message(name, size, alignment, available)
                )
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
