"""Files written whole or not at all, and output folders checked before any work."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

from mstar_resources.files import folder_problem, write_whole


def test_a_file_is_replaced_whole(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("old\n")
    write_whole(path, "new\n")
    assert path.read_text() == "new\n"
    assert [p.name for p in tmp_path.iterdir()] == ["x.yaml"]


def test_an_error_while_writing_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "x.yaml"
    path.write_text("old\n")

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_whole(path, "new\n" * 1000)
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["x.yaml"]


def test_a_process_killed_mid_write_leaves_the_old_file_whole(tmp_path):
    """The process dies (no cleanup at all) after half the new text reached the disk."""
    path = tmp_path / "x.yaml"
    path.write_text("old: 1\n")
    script = textwrap.dedent(f"""
        import os
        from mstar_resources.files import write_whole

        real_fsync = os.fsync
        def crash(fd):
            real_fsync(fd)
            os._exit(9)  # killed after the data hit the disk, before the rename
        os.fsync = crash
        write_whole({str(path)!r}, "new: 2\\n" * 100_000)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 9, done.stderr
    assert path.read_text() == "old: 1\n"
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "x.yaml"]
    assert all(name.startswith(".x.yaml.") and name.endswith(".tmp") for name in leftovers)


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        pytest.param(lambda d: None, None, id="missing-folder-can-be-made"),
        pytest.param(lambda d: (d / "f").write_text(""), "is a file, not a folder", id="file"),
        pytest.param(
            lambda d: (d / "f").symlink_to(d / "gone"),
            "is a symbolic link to",
            id="dangling-symlink",
        ),
    ],
)
def test_a_folder_is_checked_without_being_made(tmp_path, make, problem):
    make(tmp_path)
    target = tmp_path / "f" / "deployment"
    found = folder_problem(target)
    assert (found is None) if problem is None else (problem in found)
    assert not target.exists()


def test_threads_writing_one_file_each_write_it_whole(tmp_path):
    path = tmp_path / "x.yaml"
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        for _ in range(20):
            try:
                write_whole(path, f"writer: {n}\n" * 1000)
            except BaseException as error:  # every failure is the finding
                errors.append(error)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    lines = set(path.read_text().splitlines())
    assert len(lines) == 1 and lines.pop().startswith("writer: ")  # one writer's file, whole
    assert [p.name for p in tmp_path.iterdir()] == ["x.yaml"]
