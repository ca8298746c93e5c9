"""A setting's limits, stated once on its field and checked by one routine."""

from __future__ import annotations

import dataclasses
import math

import pytest

from mstar_resources._internal import limits
from mstar_resources.apps.calibrate_settings import CalibrateSettings


@dataclasses.dataclass
class Example:
    count: int = dataclasses.field(default=1, metadata=limits.bounds("a count", ge=1))
    share: float = dataclasses.field(default=0.5, metadata=limits.bounds("a share", ge=0, le=1))
    size: int | None = dataclasses.field(default=None, metadata=limits.bounds("MB", ge=1, le=8))
    name: str = dataclasses.field(default="x", metadata={"expects": "a name"})


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param({}, [], id="defaults"),
        pytest.param({"count": 0}, ["count=0 must be at least 1 (a count)"], id="below"),
        pytest.param({"share": 1.5}, ["share=1.5 must be at least 0 and at most 1 (a share)"],
                     id="above-a-float"),
        pytest.param({"share": math.inf},
                     ["share=inf is not a finite number; it must be at least 0 and at most 1 "
                      "(a share)"],
                     id="not-finite"),
        pytest.param({"count": math.nan},
                     ["count=nan is not a finite number; it must be at least 1 (a count)"],
                     id="nan"),
        pytest.param({"size": 9}, ["size=9 must be at least 1 and at most 8 (MB)"], id="above"),
        pytest.param({"size": None}, [], id="null-is-the-type's-business"),
        pytest.param({"count": 0, "size": 0},
                     ["count=0 must be at least 1 (a count)",
                      "size=0 must be at least 1 and at most 8 (MB)"], id="every-problem"),
    ],
)  # fmt: skip
def test_every_bounded_field_is_checked_in_field_order(values, expected):
    assert limits.problems(Example(**values), Example) == expected
    assert limits.problems({**dataclasses.asdict(Example()), **values}, Example) == expected


def test_expects_says_the_bounds_once():
    fields = {field.name: field for field in dataclasses.fields(Example)}
    assert limits.expects(fields["count"]) == "a count, at least 1"
    assert limits.expects(fields["share"]) == "a share, at least 0 and at most 1"
    assert limits.expects(fields["name"]) == "a name"


def test_an_unknown_bound_is_a_programming_error():
    with pytest.raises(TypeError, match="unexpected keyword"):
        limits.bounds("x", min=1)


def test_calibration_s_defaults_are_within_their_limits():
    assert limits.problems(CalibrateSettings(), CalibrateSettings) == []
