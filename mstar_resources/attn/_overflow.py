"""Reading FlashInfer's report that a plan ran out of float workspace.

FlashInfer's ``AlignedAllocator`` (``include/flashinfer/allocator.h``) throws when a plan's scratch
does not fit, and the error reaches Python as a plain ``RuntimeError`` whose text is all there is
to go on. Two forms exist:

- since 0.2.9: ``Buffer overflow when allocating memory for NAME with size N and alignment A, but
  only R bytes available in AlignedAllocator. ...``
- before 0.2.9: ``Failed to allocate memory for NAME with size N and alignment A in
  AlignedAllocator``

The same allocator serves the int workspace, which growing the float one cannot help. Float
allocations hold split-KV partial results and are named for them (``batch_decode_tmp_v``,
``batch_prefill_tmp_s``, ``mla_partial_o``, ``holistic_partial_lse``, ...); int ones hold indices.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_OVERFLOW = re.compile(
    r"Buffer overflow when allocating memory for (?P<name>\S+) with size (?P<size>\d+) "
    r"and alignment (?P<alignment>\d+), but only (?P<available>\d+) bytes available"
    r"|Failed to allocate memory for (?P<old_name>\S+) with size (?P<old_size>\d+) "
    r"and alignment (?P<old_alignment>\d+) in AlignedAllocator"
)

# Partial outputs (``tmp_v``/``partial_o``) and their log-sum-exp (``tmp_s``/``partial_lse``).
_FLOAT_ALLOCATION = re.compile(r"(?:^|_)(?:tmp_[vs]|partial_(?:o|lse))$")


@dataclass(frozen=True)
class Overflow:
    """One failed float-workspace allocation, as FlashInfer reported it."""

    allocation: str
    size: int
    alignment: int
    available: int | None
    """Bytes left in the buffer when it failed; FlashInfer before 0.2.9 did not say."""

    def bytes_needed(self, buffer_bytes: int) -> int:
        """The buffer size at which this allocation fits, in a buffer of ``buffer_bytes``.

        Without ``available`` the bytes already taken are unknown, and the whole buffer is the
        bound on them.
        """
        taken = buffer_bytes if self.available is None else buffer_bytes - self.available
        return _round_up(taken, self.alignment) + self.size


def _round_up(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment if alignment > 1 else value


def parse_float_overflow(error: BaseException) -> Overflow | None:
    """The float-workspace overflow ``error`` reports, or None if it reports anything else."""
    match = _OVERFLOW.search(str(error))
    if match is None:
        return None
    if match["name"] is not None:
        allocation, size, alignment = match["name"], match["size"], match["alignment"]
        available: int | None = int(match["available"])
    else:
        allocation, size, alignment = match["old_name"], match["old_size"], match["old_alignment"]
        available = None
    if not _FLOAT_ALLOCATION.search(allocation):
        return None
    return Overflow(allocation, int(size), int(alignment), available)
