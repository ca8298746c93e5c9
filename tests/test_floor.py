"""A workspace's floor: declared, else MSTAR_WORKSPACE_BUFFER_MB, else 512 MB."""

from __future__ import annotations

import re

import pytest

from mstar_resources import ResourceConfigError, workspace_bytes
from mstar_resources.floor import Floor, resolve_floor
from mstar_resources.units import MIB

VAR = "MSTAR_WORKSPACE_BUFFER_MB"


@pytest.mark.parametrize(
    ("declared", "env", "expected"),
    [
        pytest.param(64, {}, Floor(64, "declared", "declared_mb"), id="declared"),
        pytest.param(64, {VAR: "9"}, Floor(64, "declared", "declared_mb"), id="declared-wins"),
        pytest.param(None, {VAR: "128"}, Floor(128, "env", VAR), id="env"),
        pytest.param(None, {VAR: " 128\n"}, Floor(128, "env", VAR), id="padded"),
        pytest.param(None, {}, Floor(512, "default", VAR), id="default"),
        pytest.param(None, {VAR: ""}, Floor(512, "default", VAR), id="empty-unset"),
    ],
)  # fmt: skip
def test_precedence_and_provenance(declared, env, expected):
    assert resolve_floor(declared, env) == expected


def test_workspace_bytes_reads_the_process_environment(monkeypatch):
    monkeypatch.delenv("MSTAR_WORKSPACE_BUFFER_MB", raising=False)
    assert workspace_bytes() == 512 * MIB
    monkeypatch.setenv("MSTAR_WORKSPACE_BUFFER_MB", "3")
    assert workspace_bytes() == 3 * MIB
    assert workspace_bytes(2) == 2 * MIB
    monkeypatch.setenv("MSTAR_WORKSPACE_BUFFER_MB", "")
    assert workspace_bytes() == 512 * MIB


@pytest.mark.parametrize(
    "value", ["abc", "-5", "1.5", "512MB", "1e3", "٣", "\uff11\uff12", "1__0", "_1"]
)
def test_bad_variable_names_it_and_quotes_the_value(monkeypatch, value):
    monkeypatch.setenv("MSTAR_WORKSPACE_BUFFER_MB", value)
    with pytest.raises(
        ResourceConfigError, match=re.escape(f"MSTAR_WORKSPACE_BUFFER_MB={value!r}")
    ):
        workspace_bytes()


@pytest.mark.parametrize("declared", [0, -1, 1.5, True])
def test_bad_declared_mb_names_it_and_the_value(declared):
    with pytest.raises(
        ResourceConfigError, match=re.escape(f"declared_mb={declared!r} is not a positive")
    ):
        workspace_bytes(declared)


def test_a_declared_mb_as_text_is_read_as_the_command_line_reads_it():
    assert workspace_bytes("64") == workspace_bytes("+6_4") == 64 << 20
    with pytest.raises(ResourceConfigError, match=re.escape("declared_mb='\u0663' is not")):
        workspace_bytes("\u0663")


def test_a_bad_variable_does_not_matter_when_the_size_is_declared():
    assert resolve_floor(8, {VAR: "junk"}).mb == 8


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (1 << 21, "2,097,152"),
        (10**59, f"{10**59:,}"),
        (10**61, "<a number of 62 digits>"),
        (10**320 - 1, "<a number of 320 digits>"),
        (10**5000, "<a number of 5,001 digits>"),  # past Python's 4,300-digit str() limit
    ],
    ids=["2M", "60-digits", "62-digits", "320-digits", "5001-digits"],
)
def test_a_floor_too_large_is_named_as_such_and_shown_readably(value, shown):
    from mstar_resources.floor import mb_problem

    assert mb_problem("declared_mb", value) == (
        f"declared_mb={shown} MB is more than 1,048,576 (1 TiB, more than any GPU holds); "
        "declare the workspace's floor in MB, e.g. declared_mb=256"
    )


@pytest.mark.parametrize(("value", "mb"), [("+8", 8), ("1_000", 1000), ("012", 12), (" 64 ", 64)])
def test_the_variable_takes_numbers_as_the_command_line_does(monkeypatch, value, mb):
    """The command line's rule (Hydra's integers): a +, _ between digits, leading zeros."""
    monkeypatch.setenv("MSTAR_WORKSPACE_BUFFER_MB", value)
    assert workspace_bytes() == mb * MIB


@pytest.mark.parametrize(
    ("value", "said"),
    [("0", "=0 is not a positive whole number of MB"),
     ("1048577", "=1,048,577 MB is more than 1,048,576"),
     ("9" * 5000, "=<a number of 5,000 digits> MB is more than 1,048,576")],
)  # fmt: skip
def test_a_variable_out_of_range_says_so_and_shows_the_number_readably(monkeypatch, value, said):
    monkeypatch.setenv("MSTAR_WORKSPACE_BUFFER_MB", value)
    with pytest.raises(ResourceConfigError) as raised:
        workspace_bytes()
    assert f"MSTAR_WORKSPACE_BUFFER_MB{said}" in str(raised.value)
    assert len(str(raised.value)) < 400
