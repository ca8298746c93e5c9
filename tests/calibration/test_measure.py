"""Measuring on the CPU: the plan arguments (pure torch), which wrapper plans each shape, how a
need is found (asked, or grown into), and how calibration treats a shape FlashInfer refuses.

FlashInfer is not needed: its wrappers are honest fakes (they answer ``workspace_size()`` and
overflow as FlashInfer's do, and refuse shapes by a stand-in for FlashInfer's refusal type), and
its module is a fake that records how each wrapper was built. The real wrappers are measured in
test_calibrate_gpu.py."""

from __future__ import annotations

import dataclasses
import sys
import types
from typing import Any

import pytest
import torch

from mstar_resources import ResourceConfigError
from mstar_resources.attn._flashinfer import REFUSAL as FLASHINFER_REFUSAL
from mstar_resources.attn._flashinfer import refusals as flashinfer_refusals
from mstar_resources.calibration.measure import Need, Planner, Shape, is_bounding, shapes_for
from mstar_resources.calibration.profile import PlanKind, PlanProfile, load_profile
from mstar_resources.units import MIB

from ..attn.fake_allocator import flashinfer_overflow_message
from ..conftest import compose_shipped


class FakeRefusal(ValueError):
    """Stands in for FlashInfer's refusal type, which needs FlashInfer installed."""


class FakeWrapper:
    """Plans a shape by needing 1 KiB per request, or raising what ``errors`` says for it."""

    def __init__(self, buffer: torch.Tensor, errors: dict[Shape, BaseException]) -> None:
        self.buffer, self.errors = buffer, errors

    def plan(self, shape: Shape) -> None:
        if shape in self.errors:
            raise self.errors[shape]
        need = 1024 * shape.batch
        if self.buffer.numel() < need:
            message = flashinfer_overflow_message(
                "batch_prefill_tmp_v", need, 16, self.buffer.numel()
            )
            raise RuntimeError(message)


class FakePlanner(Planner):
    def __init__(self, errors: dict[Shape, BaseException]) -> None:
        super().__init__(PROFILE, torch.device("cpu"))
        self.refusals = (FakeRefusal,)
        self.errors = errors

    def plan_args(self, kind: Any, shape: Shape) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (shape,), {}

    def wrapper(self, plan: Any, buffer: torch.Tensor, shape: Shape) -> FakeWrapper:
        return FakeWrapper(buffer, self.errors)


PROFILE = load_profile(compose_shipped(["deployment=llama3-8b-h200"]).calibration)
PREFILL = PROFILE.plans["prefill"]
SHAPES = shapes_for(PREFILL, PROFILE, cuda_graph=False)
BOUNDING = [shape for shape in SHAPES if is_bounding(shape, PREFILL, PROFILE)]
OTHERS = [shape for shape in SHAPES if not is_bounding(shape, PREFILL, PROFILE)]


def test_the_profile_has_shapes_of_both_sorts():
    assert BOUNDING and OTHERS
    assert all(shape.kv_len == PROFILE.limits.max_model_len for shape in BOUNDING)


def test_a_refused_shape_that_does_not_bound_the_need_is_reported_and_the_need_kept():
    refused = OTHERS[0]
    need = FakePlanner({refused: FakeRefusal("too many work items")}).need_by_growth(
        PREFILL, SHAPES, None
    )
    assert need.bytes == 1024 * max(shape.batch for shape in SHAPES)
    assert need.refused == (f"{refused}: too many work items",)


def test_a_refused_bounding_shape_writes_no_floor_and_says_why():
    refused = BOUNDING[-1]
    planner = FakePlanner({refused: FakeRefusal("too many work items")})
    with pytest.raises(ResourceConfigError) as raised:
        planner.need_by_growth(PREFILL, SHAPES, None)
    message = str(raised.value)
    assert f"FlashInfer refused to plan {refused}, a shape that bounds" in message
    assert "too many work items" in message and "none is written" in message
    assert isinstance(raised.value.__cause__, FakeRefusal)


def test_any_other_error_propagates_unchanged():
    bug = ValueError("kv_indptr must be int32")  # a ValueError that is not a refusal
    with pytest.raises(ValueError) as raised:
        FakePlanner({OTHERS[0]: bug}).need_by_growth(PREFILL, SHAPES, None)
    assert raised.value is bug


def test_every_shape_refused_measures_nothing():
    errors: dict[Shape, BaseException] = {shape: FakeRefusal("no") for shape in OTHERS}
    with pytest.raises(ResourceConfigError, match="refused every shape"):
        FakePlanner(errors).need_by_growth(PREFILL, OTHERS, None)


def test_without_flashinfer_nothing_counts_as_a_refusal():
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        assert flashinfer_refusals() == ()
    else:
        pytest.skip("FlashInfer is installed: test_flashinfer_has_its_refusal_type checks it")


@pytest.mark.flashinfer
def test_flashinfer_has_its_refusal_type():
    """The installed FlashInfer refuses shapes with the type calibration recognises."""
    pytest.importorskip("flashinfer")
    (refusal,) = flashinfer_refusals()
    assert refusal.__module__ == FLASHINFER_REFUSAL[0]
    assert refusal.__name__ == FLASHINFER_REFUSAL[1]
    assert issubclass(refusal, ValueError)


def test_a_refusal_type_that_is_not_a_value_error_is_not_taken(monkeypatch):
    """A stand-in for FlashInfer's module that keeps the refusal type: calibration takes the type
    only while it is the ``ValueError`` it documents."""
    module_name, name = FLASHINFER_REFUSAL
    fake_module = types.ModuleType(module_name)
    monkeypatch.setitem(sys.modules, module_name, fake_module)
    setattr(fake_module, name, FakeRefusal)
    assert flashinfer_refusals() == (FakeRefusal,)
    setattr(fake_module, name, type(name, (RuntimeError,), {}))
    assert flashinfer_refusals() == ()


# --- plan arguments ------------------------------------------------------------------------------

SMALL_NODE: dict[str, Any] = {
    "model": {"num_qo_heads": 8, "num_kv_heads": 2, "head_dim": 64, "page_size": 16},
    "limits": {"max_num_seqs": 8, "max_num_batched_tokens": 256, "max_model_len": 4096},
    "cuda_graph_batch_sizes": [1, 2, 4],
    "plans": {
        "decode": {"kind": "decode"},
        "prefill": {"kind": "paged_prefill"},
        "prompt": {"kind": "ragged_prefill"},
        "mixed": {"kind": "pod"},
    },
}
SMALL = load_profile(SMALL_NODE)
HEADS = (8, 2, 64)
DTYPES = {"q_data_type": torch.bfloat16, "kv_data_type": torch.bfloat16}


def plain(args: tuple[Any, ...]) -> list[Any]:
    """``args`` with each tensor as a list, after checking it is int32 on the planner's device."""
    for arg in args:
        if isinstance(arg, torch.Tensor):
            assert (arg.dtype, arg.device.type) == (torch.int32, "cpu")
    return [arg.tolist() if isinstance(arg, torch.Tensor) else arg for arg in args]


# Three requests over 40 tokens: 3 pages of 16 each, the last holding 8. Over 32 tokens: 2 full
# pages, the last holding 16 (never 0).
PAGED_40 = [[0, 3, 6, 9], list(range(9)), [8, 8, 8], *HEADS, 16]
PAGED_32 = [[0, 2, 4, 6], list(range(6)), [16, 16, 16], *HEADS, 16]


@pytest.mark.parametrize(
    ("kind", "shape", "args", "kwargs"),
    [
        pytest.param(PlanKind.ragged_prefill, Shape(3, 5, 40),
                     [[0, 5, 10, 15], [0, 40, 80, 120], *HEADS], {"causal": True, **DTYPES},
                     id="ragged-prefill"),
        pytest.param(PlanKind.paged_prefill, Shape(3, 5, 40),
                     [[0, 5, 10, 15], *PAGED_40], {"causal": True, **DTYPES}, id="paged-prefill"),
        pytest.param(PlanKind.paged_prefill, Shape(3, 5, 32),
                     [[0, 5, 10, 15], *PAGED_32], {"causal": True, **DTYPES},
                     id="paged-prefill-full-last-page"),
        pytest.param(PlanKind.decode, Shape(3, 1, 40), PAGED_40, DTYPES, id="decode"),
        pytest.param(PlanKind.decode, Shape(3, 1, 32, cuda_graph=True), PAGED_32, DTYPES,
                     id="decode-graph"),
        pytest.param(PlanKind.pod, Shape(3, 1, 40), PAGED_40, DTYPES, id="pod"),
    ],
)  # fmt: skip
def test_plan_args_describe_the_shape(kind, shape, args, kwargs):
    planned_args, planned_kwargs = Planner(SMALL, torch.device("cpu")).plan_args(
        PlanProfile(kind), shape
    )
    assert plain(planned_args) == args
    assert planned_kwargs == kwargs


def test_an_output_dtype_the_profile_names_is_planned_and_none_is_left_to_flashinfer():
    """An FP8 query writing the model's dtype (vLLM's prefill over an FP8 cache)."""
    fp8 = dataclasses.replace(
        SMALL,
        model=dataclasses.replace(
            SMALL.model, q_dtype="float8_e4m3fn", kv_dtype="float8_e4m3fn", o_dtype="bfloat16"
        ),
    )
    planner = Planner(fp8, torch.device("cpu"))
    for kind in (PlanKind.paged_prefill, PlanKind.ragged_prefill, PlanKind.decode):
        _, kwargs = planner.plan_args(PlanProfile(kind), Shape(3, 5, 40))
        assert kwargs["q_data_type"] is torch.float8_e4m3fn
        assert kwargs["o_data_type"] is torch.bfloat16
    _, kwargs = Planner(SMALL, torch.device("cpu")).plan_args(
        PlanProfile(PlanKind.paged_prefill), Shape(3, 5, 40)
    )
    assert "o_data_type" not in kwargs


def test_an_output_dtype_that_is_no_dtype_is_named():
    with pytest.raises(ResourceConfigError) as raised:
        load_profile({**SMALL_NODE, "model": {**SMALL_NODE["model"], "o_dtype": "int4"}})
    assert "calibration.model.o_dtype='int4' is not one of" in str(raised.value)


# --- which wrapper plans a shape -----------------------------------------------------------------


class FakeFlashInferWrapper:
    """Stands in for a FlashInfer wrapper class of the fake module below: records what it was
    built with."""

    def __init__(self, buffer: torch.Tensor, layout: str = "NHD", **kwargs: Any) -> None:
        self.buffer, self.layout, self.kwargs = buffer, layout, kwargs


FAKE_WRAPPERS = (
    "BatchDecodeWithPagedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "PODWithPagedKVCacheWrapper",
)


@pytest.fixture
def recording_flashinfer(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A stand-in ``flashinfer`` module, imported in the real one's place, whose wrapper classes
    only record how they were built. Not FlashInfer: the tests using it check what the planner
    asks for (which class, which arguments); that FlashInfer takes it is checked on a GPU
    (``tests/attn/test_wrapper_kinds_gpu.py``, ``test_calibrate_gpu.py``)."""
    module = types.ModuleType("flashinfer")
    for name in FAKE_WRAPPERS:
        setattr(module, name, type(name, (FakeFlashInferWrapper,), {}))
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    return module


@pytest.mark.parametrize(
    ("kind", "backend", "wrapper", "kwargs"),
    [
        pytest.param("decode", "fa2", "BatchDecodeWithPagedKVCacheWrapper", {"backend": "fa2"},
                     id="decode"),
        pytest.param("paged_prefill", "fa3", "BatchPrefillWithPagedKVCacheWrapper",
                     {"backend": "fa3"}, id="paged-prefill"),
        pytest.param("ragged_prefill", "auto", "BatchPrefillWithRaggedKVCacheWrapper",
                     {"backend": "auto"}, id="ragged-prefill"),
        pytest.param("pod", "fa2", "PODWithPagedKVCacheWrapper", {}, id="pod-takes-no-backend"),
    ],
)  # fmt: skip
def test_the_planner_names_its_kind_s_wrapper_class_and_arguments(
    recording_flashinfer, kind, backend, wrapper, kwargs
):
    buffer = torch.zeros(0, dtype=torch.uint8)
    plan = PlanProfile(PlanKind(kind), backend)
    built = Planner(SMALL, torch.device("cpu")).wrapper(plan, buffer, Shape(2, 1, 40))
    assert type(built).__name__ == wrapper
    assert built.buffer is buffer
    assert (built.layout, built.kwargs) == ("NHD", kwargs)


@pytest.mark.parametrize(("kind", "backend"), [("decode", {"backend": "fa2"}), ("pod", {})])
def test_the_planner_hands_a_graph_wrapper_index_buffers_of_its_batch(
    recording_flashinfer, kind, backend
):
    planner = Planner(SMALL, torch.device("cpu"))
    shape = Shape(4, 1, 40, cuda_graph=True)
    kwargs = dict(planner.wrapper(PlanProfile(PlanKind(kind)), torch.zeros(0), shape).kwargs)
    assert kwargs.pop("use_cuda_graph") is True
    names = ("paged_kv_indptr_buffer", "paged_kv_indices_buffer", "paged_kv_last_page_len_buffer")
    buffers = tuple(kwargs.pop(name) for name in names)
    assert kwargs == backend
    # The buffers a graph replays with: the indptr, indices and last page lengths of its batch.
    assert plain(buffers) == plain(planner.plan_args(PlanProfile(PlanKind(kind)), shape)[0])[:3]


class CountingPlanner(Planner):
    """A planner on the CPU whose ``wrapper`` builds a fresh stand-in object each call."""

    def __init__(self) -> None:
        super().__init__(SMALL, torch.device("cpu"))
        self.built: list[Shape] = []

    def wrapper(self, plan: Any, buffer: torch.Tensor, shape: Shape) -> object:
        self.built.append(shape)
        return object()


def test_eager_shapes_share_one_wrapper_and_each_graph_shape_has_its_own():
    planner = CountingPlanner()
    wrapper_for = planner.wrappers(SMALL.plans["decode"], torch.zeros(0))
    eager = [wrapper_for(Shape(b, 1, 40)) for b in (1, 2, 4)]
    graph = [wrapper_for(Shape(b, 1, 40, cuda_graph=True)) for b in (1, 2)]
    assert eager[0] is eager[1] is eager[2]
    assert len({id(w) for w in graph}) == 2 and eager[0] not in graph
    assert planner.built == [Shape(1, 1, 40), Shape(1, 1, 40, True), Shape(2, 1, 40, True)]


# --- finding the need ----------------------------------------------------------------------------


class FakeSizedWrapper:
    """Stands in for a FlashInfer wrapper that needs 1 KiB of float workspace a request: asked,
    ``workspace_size()`` answers as FlashInfer's does (a tuple, the float bytes first), or raises
    ``NotImplementedError`` as a backend without the query does; ``plan()`` overflows as
    FlashInfer's allocator does."""

    def __init__(self, buffer: torch.Tensor, answers: bool, per_request: int = 1024) -> None:
        self.buffer, self.answers, self.per_request = buffer, answers, per_request
        self.asked = 0

    def _need(self, indptr: torch.Tensor) -> int:
        return self.per_request * (indptr.numel() - 1)  # every kind's first argument: an indptr

    def workspace_size(self, indptr: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[int, int]:
        self.asked += 1
        if not self.answers:
            raise NotImplementedError("workspace_size() is not implemented for this backend")
        # The float workspace's bytes, then the int workspace's: 16 bytes of indices a request.
        return self._need(indptr), 16 * (indptr.numel() - 1)

    def plan(self, indptr: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        need = self._need(indptr)
        if self.buffer.numel() < need:
            message = flashinfer_overflow_message("tmp_v", need, 16, self.buffer.numel())
            raise RuntimeError(message)


class SizedPlanner(Planner):
    """A planner on the CPU with the real plan arguments and :class:`FakeSizedWrapper`s."""

    def __init__(self, answers: bool, per_request: int = 1024) -> None:
        super().__init__(SMALL, torch.device("cpu"))
        self.answers, self.per_request = answers, per_request
        self.built: list[FakeSizedWrapper] = []

    def wrapper(self, plan: Any, buffer: torch.Tensor, shape: Shape) -> FakeSizedWrapper:
        self.built.append(FakeSizedWrapper(buffer, self.answers, self.per_request))
        return self.built[-1]


class FakeProgress:
    """Stands in for a tqdm bar: counts its updates."""

    def __init__(self) -> None:
        self.n = 0

    def update(self) -> None:
        self.n += 1


@pytest.mark.parametrize("label", ["decode", "prefill"])
def test_a_wrapper_that_answers_workspace_size_is_asked(label):
    plan = SMALL.plans[label]
    shapes = shapes_for(plan, SMALL, cuda_graph=False)
    progress = FakeProgress()
    need = SizedPlanner(answers=True).need(plan, shapes, progress)
    most = max(shape.batch for shape in shapes)
    # Of the shapes that tie, the last (the largest) is named.
    last = [shape for shape in shapes if shape.batch == most][-1]
    assert need == Need(1024 * most, last, "workspace_size", int_bytes=16 * most)
    assert progress.n == len(shapes)


def test_no_need_names_no_shape():
    plan = SMALL.plans["decode"]
    shapes = shapes_for(plan, SMALL, cuda_graph=True)
    need = SizedPlanner(answers=True, per_request=0).need_by_query(plan, shapes, None)
    most = max(shape.batch for shape in shapes)
    assert need == Need(0, None, "workspace_size", int_bytes=16 * most)


def test_a_backend_without_workspace_size_is_measured_by_growth():
    plan = SMALL.plans["decode"]
    shapes = shapes_for(plan, SMALL, cuda_graph=False)
    planner = SizedPlanner(answers=False)
    progress = FakeProgress()
    need = planner.need(plan, shapes, progress)
    most = max(shape.batch for shape in shapes)
    first = next(shape for shape in shapes if shape.batch == most)  # the one that grew it
    # It keeps no int workspace of its own to replace, so its int need is not measured.
    assert need == Need(1024 * most, first, "growth", int_bytes=None)
    assert planner.built[0].asked == 1  # asked once, then planned
    assert progress.n == len(shapes)


@pytest.mark.parametrize("label", ["prompt", "mixed"])
def test_kinds_that_cannot_say_are_never_asked(label):
    plan = SMALL.plans[label]
    shapes = shapes_for(plan, SMALL, cuda_graph=False)
    planner = SizedPlanner(answers=True)
    need = planner.need(plan, shapes)
    assert need.method == "growth"
    assert need.bytes == 1024 * max(shape.batch for shape in shapes)
    assert all(wrapper.asked == 0 for wrapper in planner.built)


class FakeIndexedWrapper(FakeSizedWrapper):
    """A :class:`FakeSizedWrapper` that also keeps an int workspace and host mirror of its own, as
    FlashInfer's wrappers do, and whose plan takes 16 bytes of indices a request from it."""

    def __init__(self, buffer: torch.Tensor, answers: bool, per_request: int = 1024) -> None:
        super().__init__(buffer, answers, per_request)
        self._float_workspace_buffer = buffer
        self._int_workspace_buffer = torch.empty(8 * MIB, dtype=torch.uint8)
        self._pin_memory_int_workspace_buffer = torch.empty(8 * MIB, dtype=torch.uint8)

    def plan(self, indptr: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        indices, have = 16 * (indptr.numel() - 1), self._int_workspace_buffer.numel()
        if have < indices:
            raise RuntimeError(
                flashinfer_overflow_message("batch_decode_request_indices", indices, 16, have)
            )
        super().plan(indptr, *args, **kwargs)


def test_growth_measures_the_int_need_of_wrappers_that_keep_an_int_workspace():
    plan = SMALL.plans["decode"]
    shapes = shapes_for(plan, SMALL, cuda_graph=False)
    planner = SizedPlanner(answers=False)
    built: list[FakeIndexedWrapper] = []

    def wrapper(plan: Any, buffer: torch.Tensor, shape: Shape) -> FakeIndexedWrapper:
        built.append(FakeIndexedWrapper(buffer, answers=False))
        return built[-1]

    planner.wrapper = wrapper  # type: ignore[method-assign]
    need = planner.need(plan, shapes)
    most = max(shape.batch for shape in shapes)
    assert (need.method, need.bytes, need.int_bytes) == ("growth", 1024 * most, 16 * most)
    # Planned on the measuring int workspace, not the 8 MiB it made for itself.
    assert built[-1]._int_workspace_buffer.numel() == 16 * most
