"""The settings of the apps, as the schemas of their primary configs.

Each app registers its own in Hydra's ConfigStore when it runs, as ``<primary config>_settings``
(``mstar_resources_settings``, ``mstar_resources_calibrate_settings``, ``replay_settings``: see
``app.hydra_app``), and its primary config in ``conf/`` lists it first, so a
bad value (``format=xml``, ``margin=lots``) or a misspelled setting fails while Hydra composes,
naming the key. Each field's ``expects`` is how an error says what it takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ._limits import bounded
from .calibration.override import DEFAULT_MARGIN

__all__ = ["CalibrateSettings", "DryRunSettings", "OutputFormat", "ReplaySettings"]


class OutputFormat(Enum):
    """How ``mstar-resources`` prints its report."""

    table = "table"
    """Aligned columns, for people."""
    json = "json"
    """One JSON document on stdout and nothing else, for programs."""


@dataclass
class _Tree:
    """The keys the shipped tree composes at the top: typed node by node by their own schemas."""

    resources: Any = None
    """The resource tree (``conf/resources``), each resource typed as ``Resource``."""
    calibration: Any = None
    """The deployment's calibration profile, if it has one (``CalibrationProfile``)."""
    calibrated: Any = None
    """What calibration measured, in a ``..._calibrated`` deployment."""


@dataclass
class DryRunSettings(_Tree):
    """``mstar-resources``: resolve the tree and print what it reserves."""

    format: OutputFormat = field(default=OutputFormat.table, metadata={"expects": "table or json"})
    """``table`` for people, ``json`` for programs."""
    device: str = field(default="cpu", metadata={"expects": "cpu, cuda or cuda:N"})
    """``cpu``: a dry run, allocating nothing. ``cuda`` or ``cuda:N``: also make every declared
    workspace there and report what the GPU then holds."""


@dataclass
class CalibrateSettings(_Tree):
    """``mstar-resources-calibrate``: measure a deployment's workspaces on this GPU."""

    margin: float = field(default=DEFAULT_MARGIN, metadata=bounded("a fraction", ge=0))
    """Added to each measured need before it is declared, as a fraction of it."""
    device: str = field(default="cuda", metadata={"expects": "cuda or cuda:N"})
    """The GPU to plan on."""
    output_dir: str | None = field(default=None, metadata={"expects": "a folder, or null"})
    """Where ``<deployment>_calibrated.yaml`` goes (made if missing); null:
    ``calibrated/deployment`` under the working directory, found with ``--config-dir
    calibrated``."""
    progress: bool = field(default=True, metadata={"expects": "true or false"})
    """Show a progress bar on stderr."""


@dataclass
class ReplaySettings(_Tree):
    """``scripts/replay.py``: a serving trace through an engine's loop, two memory setups."""

    layers: int = field(default=4, metadata=bounded("a whole number of layers", ge=1))
    """Attention-and-MLP layers of the model (the attention shape is the deployment's)."""
    trace: str | None = field(
        default=None, metadata={"expects": "a .csv, .jsonl or .json trace file, or null"}
    )
    """A production trace to replay: a CSV in the Azure LLM inference trace 2023 format
    (``TIMESTAMP``, ``ContextTokens``, ``GeneratedTokens``), or JSON lines (``arrival_s``,
    ``prompt_len``, ``output_len``); prompts are seeded random tokens of those lengths. Null: a
    seeded synthetic trace."""
    trace_offset: int = field(default=0, metadata=bounded("a whole number of rows", ge=0))
    """Rows of the trace file skipped before the ``requests`` rows replayed (counted from 0,
    after the header)."""
    requests: int = field(default=64, metadata=bounded("a whole number", ge=1))
    """Requests in the synthetic trace; with a trace file, the rows read from ``trace_offset``
    on (those whose prompt does not fit ``max_model_len`` are refused, not served), or every
    row from there where the file holds fewer, which the report says."""
    step_ms: float = field(default=10.0, metadata=bounded("a number of milliseconds", gt=0))
    """Milliseconds one engine step stands for: a trace file's arrival times become arrival
    steps by it (the synthetic trace draws its arrivals in steps and ignores it). The replay's
    model is a few layers and steps faster than a served one, so arrivals are mapped to steps,
    not to its wall clock; 10 ms is the order of a served model's step with a full batch, so
    each step meets about the arrivals production would. Larger: more arrivals a step (heavier
    load, fewer steps); smaller: lighter load, more steps."""
    seed: int = field(default=0, metadata={"expects": "a whole number"})
    """Seeds the trace (its arrivals and lengths if synthetic, its prompt tokens either way) and
    the weights."""
    vocab_size: int = field(default=8192, metadata=bounded("a whole number", ge=2))
    """The LM head's vocabulary (small: the model's shapes are what matter)."""
    memory_utilization: float = field(default=0.8, metadata=bounded("a fraction", gt=0, lt=1))
    """The fraction of the free memory (after weights and workspaces) the KV cache takes."""
    warmup: bool = field(default=True, metadata={"expects": "true or false"})
    """Plan every label's bounding shapes before sealing (plans may grow the workspaces)."""
    cuda_graphs: bool = field(default=True, metadata={"expects": "true or false"})
    """Decode under CUDA graphs at the profile's graph batch sizes."""
    fixed_buffer_mb: int | None = field(
        default=None, metadata=bounded("a whole number of MB, or null", ge=1)
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
    timing_rounds: int = field(default=2, metadata=bounded("a whole number of rounds", ge=1))
    """Rounds in which each setup serves the schedule once, the order turned each round (library
    then fixed, fixed then library, ...: ABBA for 2), so that neither setup is always measured
    first; the report gives each round's decode p50 ratio beside the pooled one. 1: one round,
    library first (half the time)."""
    dry_run: bool = field(default=False, metadata={"expects": "true or false"})
    """Read and schedule the trace on this machine, with no GPU, and print what it asks of the
    engine (requests served, refused and clipped, steps, the most requests and tokens in a step,
    KV pages): a trace checked before a GPU is rented."""
