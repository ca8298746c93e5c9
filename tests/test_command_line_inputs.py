"""Odd command lines and config folders given to the apps: a ``--config-dir`` whose path holds
what Hydra's grammar reads (``,``, ``=``, quotes, non-ASCII letters), one without a
``deployment/`` folder, a deployment folder holding a FIFO, a link to a device or a folder named
like a file, a deployment file that declares nothing or sets ``hydra``, an override with no key,
a deletion that deletes nothing, a ``+`` on a group the config picks already, a ``--config-path``
without the app's primary config, a ``--help`` over a broken deployment, an ``output_dir`` no
file system takes. Each composes, or ends in one paragraph and exit status 2, naming what was
given."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .apps import run_app
from .engine.test_engine import run_engine
from .test_app_inputs import CALIBRATE, assert_one_paragraph

ROOT = Path(__file__).parents[1]
SHIPPED = ROOT / "conf" / "deployment"
PROG = "mstar-resources"
OWNED = ("# @package _global_\ndefaults:\n  - llama3-8b-h200\n  - _self_\nresources:\n  attn:\n"
         "    decode:\n      owner: {owner}\n")  # fmt: skip


def config_dir(parent: Path, name: str, body: str | None = None) -> Path:
    """A config folder ``parent/name`` whose deployment ``mine`` holds ``body`` (default: the
    shipped llama3-8b-h200's text)."""
    folder = parent / name
    (folder / "deployment").mkdir(parents=True)
    text = body if body is not None else (SHIPPED / "llama3-8b-h200.yaml").read_text()
    (folder / "deployment" / "mine.yaml").write_text(text)
    return folder


def decode_floor(stdout: str) -> int:
    (decode,) = [r for r in json.loads(stdout)["resources"] if r["path"] == "attn.decode"]
    return int(decode["floor_mb"])


@pytest.mark.parametrize("name", ["dë", "a,b", "a=b", "it's", "a]b", "x y"])
def test_a_config_dir_whose_path_holds_hydra_s_grammar_composes(tmp_path, name):
    folder = config_dir(tmp_path, name, "# @package _global_\n"
                        "resources: {attn: {decode: {declared_mb: 77}}}\n")  # fmt: skip
    done = run_app("--config-dir", str(folder), "deployment=mine", "format=json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert decode_floor(done.stdout) == 77


@pytest.mark.parametrize(
    ("given", "named"),
    [
        pytest.param("my-conf/deployment",
                     ["--config-dir my-conf/deployment holds none of the folders",
                      "--config-dir {tmp}/my-conf"], id="deployment-folder"),
        pytest.param("/", ["--config-dir / holds none of the folders", "deployment/"],
                     id="the-root"),
    ],
)  # fmt: skip
def test_a_config_dir_without_a_deployment_folder_is_refused(tmp_path, given, named):
    config_dir(tmp_path, "my-conf")
    done = run_app("--config-dir", given, "deployment=mine", cwd=tmp_path)
    assert_one_paragraph(done, PROG, *(text.format(tmp=tmp_path) for text in named))


def make_odd(path: Path, odd: str) -> None:
    """At ``path``, something named like a YAML file that is no regular file."""
    if odd == "fifo":
        os.mkfifo(path)
    elif odd == "device-link":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()


ODD = ["fifo", "device-link", "folder"]


@pytest.mark.parametrize("odd", ODD)
def test_odd_files_beside_a_file_that_is_not_utf8_are_never_read(tmp_path, odd):
    """The search for the file Hydra could not decode reads regular files only: a FIFO would
    hang it, a link to /dev/zero would read without end, a folder would raise."""
    folder = config_dir(tmp_path, "c", "# @package _global_\n# caf\xe9\n")
    (folder / "deployment" / "mine.yaml").write_bytes(b"# @package _global_\n# caf\xe9\n")
    make_odd(folder / "deployment" / "other.yaml", odd)
    done = run_app("--config-dir", "c", "deployment=mine", cwd=tmp_path)
    mine = folder.resolve() / "deployment" / "mine.yaml"
    assert_one_paragraph(done, PROG, f"{mine} is not UTF-8 text", "line 2")


def test_the_deployment_picked_is_named_where_another_file_is_not_utf8_either(tmp_path):
    """The file picked is read first: named, not the first of the folder's files that is not
    UTF-8 either."""
    folder = config_dir(tmp_path, "c", "")
    (folder / "deployment" / "mine.yaml").write_bytes(b"# @package _global_\n# caf\xe9\n")
    (folder / "deployment" / "archive").mkdir()
    (folder / "deployment" / "archive" / "aaa.yaml").write_bytes(b"# \xff\n")
    done = run_app("--config-dir", "c", "deployment=mine", cwd=tmp_path)
    mine = folder.resolve() / "deployment" / "mine.yaml"
    assert_one_paragraph(done, PROG, f"{mine} is not UTF-8 text", "line 2")


def test_another_config_file_that_is_not_utf8_is_named(tmp_path):
    """A deployment whose defaults list composes a file that is not UTF-8: that file is named,
    with the byte's line."""
    folder = config_dir(tmp_path, "c", "# @package _global_\ndefaults:\n  - other\n")
    (folder / "deployment" / "other.yaml").write_bytes(b"# @package _global_\n# caf\xe9\n")
    done = run_app("--config-dir", "c", "deployment=mine", cwd=tmp_path)
    other = folder.resolve() / "deployment" / "other.yaml"
    assert_one_paragraph(done, PROG, f"{other} is not UTF-8 text", "line 2")


@pytest.mark.parametrize("odd", ODD)
def test_a_deployment_that_is_no_regular_file_is_refused_unread(tmp_path, odd):
    (tmp_path / "c" / "deployment").mkdir(parents=True)
    make_odd(tmp_path / "c" / "deployment" / "mine.yaml", odd)
    done = run_app("--config-dir", "c", "deployment=mine", cwd=tmp_path)
    assert_one_paragraph(done, PROG, f"deployment=mine picks {tmp_path.resolve()}/c/", "which is")


@pytest.mark.parametrize(
    ("body", "named"),
    [
        pytest.param("# @package _global_\n", "declares nothing", id="nothing"),
        pytest.param("# @package _global_\n# a comment\n", "declares nothing", id="comments"),
        pytest.param("# @package _global_\nhydra: {run: {dir: out}}\n"
                     "resources: {attn: {decode: {declared_mb: 7}}}\n", "sets hydra",
                     id="a-hydra-block"),
    ],
)  # fmt: skip
def test_a_deployment_file_is_refused_for_what_hydra_would_compose_without_a_word(
    tmp_path, body, named
):
    config_dir(tmp_path, "c", body)
    done = run_app("--config-dir", "c", "deployment=mine", cwd=tmp_path)
    assert_one_paragraph(done, PROG, "deployment=mine (", named)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        pytest.param(["=5"], ["=5 names no setting before its ="], id="no-key"),
        pytest.param(["~resources.attn.decode.declared_mb"],
                     ["deletes resources.attn.decode.declared_mb, which is unset (null) already"],
                     id="delete-a-null"),
        pytest.param(["~resources.attn.decode.declard_mb"],
                     ["which is not a setting (did you mean resources.attn.decode.declared_mb?)"],
                     id="delete-a-misspelt-key"),
        pytest.param(["deployment=llama3-8b-h200", "~resources.attn.decode.declared_mb"],
                     ["resources.attn.decode.declared_mb, a setting of the schema"],
                     id="delete-a-schema-key"),
        pytest.param(["+deployment=llama3-8b-h200"],
                     ["+deployment=llama3-8b-h200 adds a second deployment",
                      "deployment=llama3-8b-h200"], id="add-a-picked-group"),
        pytest.param(["--config-path", "{tmp}"],
                     ["--config-path {tmp} replaces the folder", "mstar_resources.yaml",
                      "--config-dir DIR"], id="config-path-without-the-primary-config"),
        pytest.param(["--foo"], ["--foo is not a flag mstar-resources takes"], id="no-such-flag"),
        pytest.param(["hydra.run.dir=/x"], ["hydra.run.dir=/x is not supported"],
                     id="a-hydra-setting"),
        pytest.param(["hydra.job.chdir=true"], ["hydra.job.chdir=true is not supported"],
                     id="hydra-job-chdir"),
        pytest.param(["--package", "x"], ["--package x is not supported"], id="package"),
        pytest.param(["--cfg"], ["--cfg/-c: expected one argument"], id="a-flag-without-its-value"),
        pytest.param(["--resolve"], ["--resolve resolves the config --cfg prints"],
                     id="resolve-without-cfg"),
        pytest.param(["--experimental-rerun", "x"], ["--experimental-rerun is not supported"],
                     id="rerun"),
    ],
)  # fmt: skip
def test_an_odd_command_line_is_one_paragraph_naming_what_was_given(tmp_path, args, named):
    given = [arg.format(tmp=tmp_path) for arg in args]
    done = run_app(*given, cwd=tmp_path)
    assert_one_paragraph(done, PROG, *(text.format(tmp=tmp_path) for text in named))


def test_calibration_s_help_lists_its_deployments_beside_a_broken_one(tmp_path):
    config_dir(tmp_path, "c", "# @package _global_\nresources: [\n")
    done = run_app("--config-dir", "c", "--help", cwd=tmp_path, python=CALIBRATE)
    assert done.returncode == 0, done.stderr
    assert "llama3-8b-h200" in done.stdout and "Traceback" not in done.stderr


@pytest.mark.parametrize("output_dir", ["x" * 300, f"a/{'x' * 300}/b"])
def test_an_output_dir_no_file_system_takes_is_refused_before_any_gpu_work(tmp_path, output_dir):
    done = run_app(
        "deployment=llama3-8b-h200", f"output_dir={output_dir}", cwd=tmp_path, python=CALIBRATE
    )
    assert_one_paragraph(done, "mstar-resources-calibrate", f"output_dir='{output_dir[:20]}")
    assert "torch sees no CUDA device" not in done.stderr


def test_an_engine_s_config_dir_of_its_own_groups_is_taken(tmp_path):
    """The refusal of a --config-dir that adds nothing reads the groups the app composes: an
    engine's folder of its own group (here the example engine's model/) is taken."""
    (tmp_path / "mine" / "model").mkdir(parents=True)
    (tmp_path / "mine" / "model" / "tiny.yaml").write_text(
        "name: tiny\nnum_qo_heads: 4\nnum_kv_heads: 1\nhead_dim: 64\n"
    )
    done = run_engine("--config-dir", "mine", "model=tiny", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["model"] == "tiny"


def test_a_config_dir_that_is_a_loop_of_links_is_refused(tmp_path):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    done = run_app(f"--config-dir={tmp_path / 'loop'}", cwd=tmp_path)
    assert_one_paragraph(done, PROG, f"--config-dir {tmp_path / 'loop'} can't be read")


def test_a_config_dir_through_a_file_is_named_as_no_folder(tmp_path):
    (tmp_path / "afile").touch()
    done = run_app("--config-dir", "afile/..", cwd=tmp_path)
    assert_one_paragraph(done, PROG, "--config-dir afile/.. is not there", "a folder of configs")


def test_a_deleted_working_directory_and_an_ascii_terminal_end_without_a_traceback(tmp_path):
    folder = config_dir(tmp_path, "conf", OWNED.format(owner="équipe"))
    script = (f"mkdir gone && cd gone && rmdir ../gone && {sys.executable} -m "
              "mstar_resources.apps.dry_run deployment=llama3-8b-h200")  # fmt: skip
    gone = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert gone.returncode == 2 and "the working directory was deleted" in gone.stderr
    ascii_only = subprocess.run(
        [sys.executable, "-m", "mstar_resources.apps.dry_run", f"--config-dir={folder}",
         "deployment=mine"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONIOENCODING": "ascii"},
    )  # fmt: skip
    assert ascii_only.returncode == 0, ascii_only.stderr
    assert "\\xe9quipe" in ascii_only.stdout and "Traceback" not in ascii_only.stderr


@pytest.mark.parametrize("locked", ["", "deployment"])
def test_a_config_dir_this_user_cannot_read_is_named_as_such(tmp_path, monkeypatch, locked):
    """As for a folder of mode 000 and a user other than root (who reads any folder)."""
    folder = config_dir(tmp_path, "conf")
    unreadable = str(folder / locked) if locked else str(folder)
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: os.fspath(path).rstrip("/") != unreadable
                        and access(path, mode))  # fmt: skip
    done = run_app(f"--config-dir={folder}", "deployment=mine", cwd=tmp_path)
    assert_one_paragraph(done, PROG, "can't be read by this user")
