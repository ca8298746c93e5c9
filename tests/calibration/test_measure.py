"""How calibration treats a shape FlashInfer refuses, on the CPU: a planner whose wrappers are
honest fakes (they overflow as FlashInfer's allocator does, and refuse shapes by a stand-in for
FlashInfer's refusal type). The real wrappers are measured in test_calibrate_gpu.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from mstar_resources import ResourceConfigError
from mstar_resources.calibration.measure import FLASHINFER_REFUSAL, Planner, flashinfer_refusals
from mstar_resources.calibration.shapes import Shape, is_bounding, shapes_for
from mstar_resources.profile import load_profile

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
        super().__init__(PROFILE, torch.device("cpu"), refusals=(FakeRefusal,))
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
