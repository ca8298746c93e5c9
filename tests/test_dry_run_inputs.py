"""The dry run on odd inputs a new user tried: each a paragraph naming the setting and the value,
exit status 2, and a calibrated deployment checked against what it composes now."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from mstar_resources import ResourceConfigError, check_calibration, resolve, schema
from mstar_resources.schema import MAX_ITEMS, Resource

from .apps import run_app
from .conftest import compose_shipped

CAL = "deployment=llama3-8b-h200_calibrated"


def test_a_calibrated_floor_is_declared_with_its_need_and_margin_under_the_table(tmp_path):
    """Calibration wrote declared_mb: the table's source is the JSON's (declared), and the line
    under the table says calibration declared it, with its need and margin."""
    done = run_app(CAL, cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    lines = done.stdout.splitlines()
    report = json.loads(run_app(CAL, "format=json", cwd=tmp_path).stdout)
    sources = [(r["floor_source"], r["int_floor_source"]) for r in report["resources"]]
    assert [(line.split()[5], line.split()[9]) for line in lines[2:4]] == sources
    assert sources == [("declared", "declared")] * 2
    assert (
        "attn.decode: declared by calibration, need 2,179,584 bytes + 0% "
        "(resources.attn.decode.declared_mb); int need 4,384 bytes "
        "(resources.attn.decode.int_declared_mb)" in lines
    )


def test_a_floor_set_over_the_calibrated_one_is_declared(tmp_path):
    done = run_app(CAL, "resources.attn.decode.declared_mb=96", "format=json", cwd=tmp_path)
    report = json.loads(done.stdout)
    sources = {r["path"]: r["floor_source"] for r in report["resources"]}
    assert sources == {"attn.prefill": "declared", "attn.decode": "declared"}
    assert set(report["calibrated"]) == {"attn.prefill"}
    assert report["calibrated"]["attn.prefill"] == {
        "need_bytes": 17_436_672, "margin": 0.0, "int_need_bytes": 4_104,
    }  # fmt: skip


def test_an_int_floor_set_over_the_calibrated_one_is_declared(tmp_path):
    done = run_app(CAL, "resources.attn.decode.int_declared_mb=4", "format=json", cwd=tmp_path)
    report = json.loads(done.stdout)
    decode = next(r for r in report["resources"] if r["path"] == "attn.decode")
    assert (decode["int_floor_mb"], decode["int_floor_source"]) == (4, "declared")
    # Its float floor is still calibration's; its int need is no longer what the floor says.
    assert report["calibrated"]["attn.decode"]["int_need_bytes"] is None


@pytest.mark.parametrize(
    ("override", "named"),
    [
        pytest.param("calibration.model.head_dim=256",
                     "profile.model.head_dim (128 recorded, 256 here)", id="profile"),
        pytest.param("resources.attn.decode.cg_slots=[0]",
                     "resources.attn.decode.cg_slots ([0, 1] recorded, [0] here)", id="resources"),
    ],
)  # fmt: skip
def test_a_calibration_that_no_longer_matches_its_record_is_flagged_naming_the_field(
    tmp_path, override, named
):
    done = run_app(CAL, override, cwd=tmp_path)
    assert done.returncode == 0
    (warning,) = done.stderr.splitlines()
    assert warning.startswith(
        "mstar-resources: warning: deployment llama3-8b-h200's calibration was made with "
        "other inputs than it composes now: "
    )
    assert named in warning
    assert warning.endswith(
        "recalibrate with `mstar-resources-calibrate deployment=llama3-8b-h200`"
    )


def test_a_calibrated_floor_lowered_below_its_measured_need_is_flagged(tmp_path):
    done = run_app(CAL, "resources.attn.decode.declared_mb=1", cwd=tmp_path)
    assert done.returncode == 0
    (warning,) = done.stderr.splitlines()
    assert warning == (
        "mstar-resources: warning: resources.attn.decode.declared_mb=1 holds 1,048,576 bytes, "
        "less than the 2,179,584 calibration measured resources.attn.decode needs: its plans past "
        "the floor grow it, and are refused once it is sealed"
    )
    assert run_app(CAL, "resources.attn.decode.declared_mb=3", cwd=tmp_path).stderr == ""


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        pytest.param([CAL, "calibration.model.head_dim=-1"], {},
                     "calibration.model.head_dim=-1 must be a positive whole number",
                     id="profile-checked-on-the-cpu"),
        pytest.param(["deployment=llama3-8b-h200"], {"MSTAR_WORKSPACE_BUFFER_MB": "abc"},
                     "MSTAR_WORKSPACE_BUFFER_MB='abc' is not a positive whole number of MB",
                     id="bad-variable-with-every-floor-declared"),
        pytest.param(["resources.attn.decode.labels=[[a,b]]"], {},
                     "holds ['a', 'b'], which is not a label; labels is a flat list",
                     id="nested-labels"),
        pytest.param(["resources.attn.decode.cg_slots.x=1"], {},
                     "resources.attn.decode.cg_slots.x=1 is not a setting: "
                     "resources.attn.decode.cg_slots is a list, whose items are set by position",
                     id="a-list-item-by-name"),
        pytest.param(["deployment=none", "calibration=5"], {},
                     "calibration=5 is not valid; calibration takes a calibration profile",
                     id="a-profile-that-is-no-mapping"),
        pytest.param([CAL, "calibrated=5"], {},
                     "calibrated=5 is not valid; calibrated takes what calibration measured",
                     id="a-record-that-is-no-mapping"),
        pytest.param(["deployment=llama3-8b-h200", "+calibration.engine=vllm"], {},
                     "calibration.engine='vllm' is not a setting; calibration takes model, ",
                     id="a-key-forced-into-the-profile"),
        pytest.param(["deployment=llama3-8b-h200", "+calibration.plans.decode.split=1"], {},
                     "calibration.plans.decode.split=1 is not a setting; calibration.plans.decode "
                     "takes kind, ", id="a-key-forced-into-a-plan"),
        pytest.param(["+deployment@foo=llama3-8b-h200"], {},
                     "moves a config group to another package, which no setting here takes; "
                     "set deployment=llama3-8b-h200", id="a-group-moved-to-a-package"),
    ],
)  # fmt: skip
def test_bad_input_is_one_paragraph_naming_it(tmp_path, args, env, named):
    done = run_app(*args, cwd=tmp_path, env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("mstar-resources: error: ") and named in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_slots_past_the_cap_are_refused_before_any_is_looked_at():
    """Refused by their count alone: no slot is read (the check of each slot was quadratic)."""

    class Unreadable(list):
        def __iter__(self):
            raise AssertionError("a slot was looked at")

        def __getitem__(self, index):
            raise AssertionError("a slot was looked at")

    slots = Unreadable(range(1_000_000))
    assert schema._slot_problems(slots) == [  # what Resource checks its cg_slots with
        f"cg_slots has 1,000,000 slots; at most {MAX_ITEMS} (each is a workspace of every label, "
        "for a graph context of its own)",
    ]
    with pytest.raises(ResourceConfigError) as raised:
        Resource(labels=["decode"], cg_slots=list(range(1_000_000)))
    assert raised.value.problems == tuple(schema._slot_problems(slots))


def test_repeated_slots_are_found_in_order_in_linear_time():
    with pytest.raises(ResourceConfigError, match=r"repeats \[7, 3\]; list each slot once"):
        Resource(labels=["decode"], cg_slots=[7, 3, 7, 1, 3, 7])


def test_thousands_of_problems_list_twenty_and_count_the_rest():
    tree = {f"r{i}": {"labels": []} for i in range(1000)}
    with pytest.raises(ResourceConfigError) as raised:
        resolve(OmegaConf.create(tree), env={})
    assert len(raised.value.problems) == 1000  # every one kept as a field
    lines = str(raised.value).splitlines()
    assert lines[0] == "1,000 problems in the resources config:"
    assert len(lines) == 22 and lines[-1] == "  - ... and 980 more, each like those above"


def test_check_calibration_on_a_cpu_says_it_needs_a_cuda_device():
    cfg = compose_shipped([CAL])
    with pytest.raises(
        ResourceConfigError, match=r"check_calibration needs a CUDA device.* got cpu"
    ):
        check_calibration(cfg, torch.device("cpu"))


def test_check_calibration_of_a_deployment_not_calibrated_is_none_on_any_device():
    assert check_calibration(compose_shipped(["deployment=llama3-8b-h200"]), "cpu") is None


BOMB = "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}' if prev else repr('lol')] * 9)}]\n"
    for prev, name in zip(["", "a", "b", "c", "d", "e", "f", "g"], "abcdefgh", strict=True)
)  # 9**8 values once followed, in 400 bytes
FILES = {
    "an alias bomb": (BOMB, "holds more than 10,000 values, its YAML aliases followed"),
    "nested lists": ("resources: " + "[" * 5000 + "]" * 5000, "nests more than 64 levels deep"),
    "nested mappings": (
        "resources: " + "{a: " * 2000 + "1" + "}" * 2000,
        "nests more than 64 levels deep",
    ),
    "too many bytes": ("# " + "x" * (1 << 20) + "\nresources: {}", "more than the 1,048,576"),
    "too many values": (  # no alias among them: composing 50,000 slots took 5 s to refuse
        "resources: {attn: {decode: {cg_slots: [" + ", ".join(["1"] * 50_000) + "]}}}",
        "holds more than 10,000 values, where a deployment holds a few dozen",
    ),
}


@pytest.mark.parametrize("body, said", FILES.values(), ids=FILES.keys())
def test_a_deployment_file_too_large_to_compose_is_refused_in_bounded_time(tmp_path, body, said):
    """Before Hydra reads it: in the dry run (status 2, one paragraph) and in both plugins'
    settings (the same paragraph, as ResourceConfigError)."""
    from mstar_resources.integrations import sglang, vllm

    path = tmp_path / "deployment" / "big.yaml"
    path.parent.mkdir()
    path.write_text("# @package _global_\n" + body)
    done = run_app(f"--config-dir={tmp_path}", "deployment=big", cwd=tmp_path)
    assert done.returncode == 2 and said in done.stderr and str(path) in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert ("aliases" in done.stderr) == ("aliases" in said)  # blamed only where there are some
    for setting in (vllm.VLLM, sglang.SGLANG):
        with pytest.raises(ResourceConfigError) as refused:
            setting.read({setting.env_var: str(path)})
        assert said in str(refused.value) and setting.env_var in str(refused.value)


def test_a_deployment_file_that_cannot_be_read_says_so(tmp_path, monkeypatch):
    """As for a file of mode 000 read by a user other than root (who reads any file)."""
    path = tmp_path / "deployment" / "locked.yaml"
    path.parent.mkdir()
    path.write_text("# @package _global_\nresources: {}\n")
    read_bytes = Path.read_bytes

    def refused_to_this_user(self: Path) -> bytes:
        if self == path:
            raise PermissionError(13, "Permission denied", str(self))
        return read_bytes(self)

    monkeypatch.setattr(Path, "read_bytes", refused_to_this_user)
    done = run_app(f"--config-dir={tmp_path}", "deployment=locked", cwd=tmp_path)
    assert done.returncode == 2
    assert "deployment=locked" in done.stderr and "can't be read (Permission denied)" in done.stderr


OVER = "# @package _global_\ndefaults:\n  - llama3-8b-h200\n  - _self_\nresources:\n  attn:\n"
SILENT = {
    "missing-mark": ("    decode:\n      declared_mb: ???\n",
                     "sets resources.attn.decode.declared_mb to ???, which leaves the value"),
    "boolean-owner": ("    decode:\n      owner: true\n",
                      "sets resources.attn.decode.owner to true, and true would become the name"),
    "number-label": ("    decode:\n      labels: [decode, 7]\n",
                     "sets resources.attn.decode.labels to [\"decode\", 7], and 7 would become"),
    "spaced-label": ("    decode:\n      labels: [' decode ']\n",
                     "labels[0]=' decode ' has spaces at its ends"),
    "other-digits": ("    decode:\n      declared_mb: '\u0663'\n",
                     "digits other than 0-9, which MSTAR_WORKSPACE_BUFFER_MB refuses"),
}  # fmt: skip


@pytest.mark.parametrize("body, said", SILENT.values(), ids=SILENT.keys())
def test_a_value_composing_would_change_without_a_word_is_refused(tmp_path, body, said):
    """docs/own-deployment.md: nothing is dropped without a word."""
    path = tmp_path / "deployment" / "mine.yaml"
    path.parent.mkdir()
    path.write_text(OVER + body)
    done = run_app(f"--config-dir={tmp_path}", "deployment=mine", cwd=tmp_path)
    assert done.returncode == 2 and said in done.stderr, done.stderr


def test_an_empty_resource_added_on_the_command_line_is_refused(tmp_path):
    done = run_app("deployment=llama3-8b-h200", "+resources.new.res={}", cwd=tmp_path)
    assert done.returncode == 2
    assert "resources.new.res is empty" in done.stderr


def test_misleading_messages_now_name_what_is_wrong(tmp_path):
    """A link that leads nowhere, a calibrated name before calibrating, an interpolation that
    fails, and resources given as a list: each named as it is."""
    folder = tmp_path / "deployment"
    folder.mkdir()
    (folder / "mine.yaml").write_text(OVER.removesuffix("resources:\n  attn:\n"))
    (folder / "broken.yaml").symlink_to(tmp_path / "nowhere.yaml")
    (folder / "loop.yaml").symlink_to("loop.yaml")
    (folder / "interp.yaml").write_text(
        OVER + "    decode:\n      declared_mb: ${oc.env:MSTAR_TEST_UNSET,abc}\n"
    )
    (folder / "list.yaml").write_text("# @package _global_\nresources: []\n")
    (folder / "yml.yml").write_text(OVER)
    (folder / "typo.yaml").write_text(
        "# @package _global_\ndefaults: [/deployment/llama3-8b-h20]\n"
    )
    expected = {
        "broken": f"a symbolic link to {tmp_path / 'nowhere.yaml'}, which does not exist",
        "loop": "a symbolic link to loop.yaml, which loops back to itself",
        # calibrating needs the --config-dir that holds mine.yaml too
        "mine_calibrated": (
            f"is not a deployment yet: `mstar-resources-calibrate --config-dir {tmp_path} "
            "deployment=mine`"
        ),
        "interp": "resources.attn.decode.declared_mb can't be read",
        "list": "sets resources to []; resources maps each resource's name to its fields",
        "yml": "(Hydra reads a deployment as NAME.yaml: rename yml.yml yml.yaml)",
        "typo": (
            "In 'deployment/typo': Could not load 'deployment/llama3-8b-h20' (did you mean "
            "/deployment/llama3-8b-h200?); deployment/ holds "
        ),
    }
    for name, said in expected.items():
        done = run_app(f"--config-dir={tmp_path}", f"deployment={name}", cwd=tmp_path)
        assert done.returncode == 2 and said in done.stderr, (name, done.stderr)


@pytest.mark.parametrize(
    ("given", "said"),
    [("calibrated.foo=1", "calibrated.foo is not a setting"),
     ("+calibrated.foo=1", "calibrated.foo is not a field of what calibration records")],
)  # fmt: skip
def test_a_field_calibration_does_not_record_is_refused(tmp_path, given, said):
    done = run_app(CAL, given, cwd=tmp_path)
    assert done.returncode == 2 and said in done.stderr, done.stderr


def test_a_deployment_listing_a_file_too_large_to_compose_is_refused(tmp_path):
    """The bound holds for the files a deployment's defaults list beside it, too."""
    folder = tmp_path / "deployment"
    folder.mkdir()
    (folder / "bomb.yaml").write_text("# @package _global_\n" + BOMB)
    (folder / "mine.yaml").write_text("# @package _global_\ndefaults:\n  - bomb\n  - _self_\n")
    done = run_app(f"--config-dir={tmp_path}", "deployment=mine", cwd=tmp_path)
    assert done.returncode == 2
    assert f"deployment=mine ({folder / 'mine.yaml'}) lists bomb, whose file" in done.stderr
    assert "holds more than 10,000 values" in done.stderr
