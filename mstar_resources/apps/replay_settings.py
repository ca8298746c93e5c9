"""The replay's settings (``scripts/replay.py``), the schema of its primary config
(``replay.yaml``); see :mod:`mstar_resources.apps.settings`."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._internal.limits import bounds
from .settings import ComposedTree

MAX_SYNTHETIC_REQUESTS = 100_000
"""The most requests of the synthetic trace (see ``ReplaySettings.requests``); a trace file's are
bounded by its rows."""

MAX_REQUESTS = 10**9
"""The most requests the setting takes: more rows than any trace file holds."""

__all__ = ["ReplaySettings"]


@dataclass
class ReplaySettings(ComposedTree):
    """``scripts/replay.py``: a serving trace through an engine's loop, two memory setups."""

    layers: int = field(default=4, metadata=bounds("a whole number of layers", ge=1))
    """Attention-and-MLP layers of the model (the attention shape is the deployment's)."""
    trace: str | None = field(
        default=None, metadata={"expects": "a .csv, .jsonl or .json trace file, or null"}
    )
    """A production trace to replay: a CSV in the Azure LLM inference trace 2023 format
    (``TIMESTAMP``, ``ContextTokens``, ``GeneratedTokens``), or JSON lines (``arrival_s``,
    ``prompt_len``, ``output_len``); prompts are seeded random tokens of those lengths. Null: a
    seeded synthetic trace."""
    trace_offset: int = field(default=0, metadata=bounds("a whole number of rows", ge=0))
    """Rows of the trace file skipped before the ``requests`` rows replayed (counted from 0,
    after the header)."""
    requests: int = field(default=64, metadata=bounds("a whole number", ge=1, le=MAX_REQUESTS))
    """Requests in the synthetic trace (at most 100,000, five times the largest public trace of
    2023, Azure's conversation trace of 19,366 rows); with a trace file, the rows read from
    ``trace_offset`` on (those whose prompt does not fit ``max_model_len`` are refused, not
    served), or every row from there where the file holds fewer, which the report says: a file's
    requests are bounded by its rows alone (BurstGPT's 5 million, say), since the file is
    streamed. 400 requests take about a minute and a half of one H200 for both setups."""
    step_ms: float = field(default=10.0, metadata=bounds("a number of milliseconds", gt=0))
    """Milliseconds one engine step stands for: a trace file's arrival times become arrival
    steps by it (the synthetic trace draws its arrivals in steps and ignores it). The replay's
    model is a few layers and steps faster than a served one, so arrivals are mapped to steps,
    not to its wall clock; 10 ms is the order of a served model's step with a full batch, so
    each step meets about the arrivals production would. Larger: more arrivals a step (heavier
    load, fewer steps); smaller: lighter load, more steps."""
    seed: int = field(default=0, metadata={"expects": "a whole number"})
    """Seeds the trace (its arrivals and lengths if synthetic, its prompt tokens either way) and
    the weights."""
    vocab_size: int = field(default=8192, metadata=bounds("a whole number", ge=2))
    """The LM head's vocabulary (small: the model's shapes are what matter)."""
    memory_utilization: float = field(default=0.8, metadata=bounds("a fraction", gt=0, lt=1))
    """The fraction of the free memory (after weights and workspaces) the KV cache takes."""
    warmup: bool = field(default=True, metadata={"expects": "true or false"})
    """Plan every label's bounding shapes before sealing (plans may grow the workspaces)."""
    cuda_graphs: bool = field(default=True, metadata={"expects": "true or false"})
    """Decode under CUDA graphs at the profile's graph batch sizes."""
    fixed_buffer_mb: int | None = field(
        default=None, metadata=bounds("a whole number of MB, or null", ge=1)
    )
    """The engines' setup: one shared buffer of this size. Null: vLLM's size for the
    deployment, max(394, max_num_batched_tokens x query heads x head dim x 16 B / 2**20), or for
    MLA, which vLLM plans without FlashInfer on SM90, SGLang's 384."""
    device: str = field(default="cuda", metadata={"expects": "cuda or cuda:N"})
    """The GPU of a one-rank run (under torchrun each rank takes cuda:<local rank>)."""
    report_dir: str | None = field(default=None, metadata={"expects": "a folder, or null"})
    """Where report.json and replay.png go (made when they are written); null: nowhere."""
    progress: bool = field(default=True, metadata={"expects": "true or false"})
    """A progress bar over the trace on stderr (rank 0)."""
    timing_rounds: int = field(default=2, metadata=bounds("a whole number of rounds", ge=1))
    """Rounds in which each setup serves the schedule once, the order turned each round (library
    then fixed, fixed then library, ...: ABBA for 2), so that neither setup is always measured
    first; the report gives each round's decode p50 ratio beside the pooled one. 1: one round,
    library first (half the time)."""
    dry_run: bool = field(default=False, metadata={"expects": "true or false"})
    """Read and schedule the trace on this machine, with no GPU, and print what it asks of the
    engine (requests served, refused and clipped, steps, the most requests and tokens in a step,
    KV pages): a trace checked before a GPU is rented."""
