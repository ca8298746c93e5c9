"""Reading FlashInfer's report that a plan ran out of a workspace, float or int: the plain
``RuntimeError`` of its ``AlignedAllocator`` (``include/flashinfer/allocator.h``), whose text is all
there is to go on, and from 0.7.4 (not 0.7.2.post1) the ``ValueError`` of the MLA wrapper's
``fa2``/``fa3`` check of the whole float workspace before they plan
(``flashinfer/mla/_batch_mla/_backends/_fa_common.py``): under ``backend="auto"``, one sentence
per backend tried, and the plan needs the most."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from ..units import round_up

_OVERFLOW = re.compile(
    r"Buffer overflow when allocating memory for (?P<name>\S+) with size (?P<size>\d+) "
    r"and alignment (?P<alignment>\d+), but only (?P<available>\d+) bytes available"
)

_MLA_PREFLIGHT = re.compile(
    r"(?P<backend>\w+) MLA needs (?P<size>\d+) float workspace bytes for partial outputs and LSE"
)
MLA_PARTIALS = "mla_partial_o+lse"
"""How a growth for MLA's preflight is named: it asks for both partial buffers at once."""

# Float allocations hold split-KV partials and are named for them: partial outputs (``tmp_v``,
# ``partial_o``) and their log-sum-exp (``tmp_s``, ``partial_lse``). Any other is an int one.
_FLOAT_ALLOCATION = re.compile(r"(?:^|_)(?:tmp_[vs]|partial_(?:o|lse))$")


@dataclass(frozen=True)
class Overflow:
    """One failed workspace allocation, as FlashInfer reported it."""

    allocation: str
    size: int
    alignment: int
    available: int
    """Bytes left in the buffer when it failed (0 where ``whole_buffer``)."""
    whole_buffer: bool = False
    """``size`` is what the whole buffer must hold (MLA's check before it plans)."""
    kind: Literal["float", "int"] = "float"
    """Which workspace ran short: ``float`` (split-KV partials) or ``int`` (a plan's indices)."""

    def bytes_needed(self, buffer_bytes: int) -> int:
        """The buffer size at which this allocation fits, in a buffer of ``buffer_bytes``."""
        if self.whole_buffer:
            return self.size
        return round_up(buffer_bytes - self.available, self.alignment) + self.size


def parse_overflow(error: BaseException) -> Overflow | None:
    """The workspace overflow ``error`` reports (float or int), or None."""
    text = str(error)
    if asked := [int(m["size"]) for m in _MLA_PREFLIGHT.finditer(text)]:
        return Overflow(MLA_PARTIALS, max(asked), 1, 0, whole_buffer=True)
    match = _OVERFLOW.search(text)
    if match is None:
        return None
    allocation = match["name"]
    kind: Literal["float", "int"] = "float" if _FLOAT_ALLOCATION.search(allocation) else "int"
    size, alignment = int(match["size"]), int(match["alignment"])
    return Overflow(allocation, size, alignment, int(match["available"]), kind=kind)
