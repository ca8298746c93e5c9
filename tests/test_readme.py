"""The user docs (README.md and docs/*.md): their `mstar-resources` examples print what the
program prints, their engine snippets run as shown, their links lead somewhere, and they name no
path of the machine they were written on."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from .apps import run_cli

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
TEXT = {path: path.read_text() for path in DOCS}
MAX_README_LINES = 300


def name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def find_all(pattern: str) -> list[tuple[Path, re.Match[str]]]:
    """Every match of ``pattern`` in every user doc, with the file it is in."""
    return [(path, m) for path in DOCS for m in re.finditer(pattern, TEXT[path], re.S)]


EXAMPLES = [
    (path, m.group(1), m.group(2))
    for path, m in find_all(r"```console\n\$ mstar-resources([^\n]*)\n(.*?)```")
]


def test_the_docs_show_the_dry_run_first_a_deployment_json_and_an_error():
    readme = [args.strip() for path, args, _ in EXAMPLES if path == README]
    assert readme and readme[0] == ""  # the README's first example: the main command, as is
    commands = [args.strip() for _, args, _ in EXAMPLES]
    assert any("deployment=" in c and "declared_mb=" in c for c in commands)
    assert any("format=json" in c for c in commands)
    assert any(output.startswith("mstar-resources: error: ") for _, _, output in EXAMPLES)


@pytest.mark.parametrize(
    ("path", "args", "output"),
    EXAMPLES,
    ids=[f"{name(path)}:{args.strip() or '-'}" for path, args, _ in EXAMPLES],
)
def test_each_example_prints_what_the_docs_show(tmp_path, path, args, output):
    done = run_cli(*shlex.split(args), cwd=tmp_path)
    assert (done.stdout + done.stderr) == output, f"{name(path)}: $ mstar-resources{args}"


ENGINE_YAML = find_all(r"### In an engine\n.*?```yaml\n(.*?)```")
ENGINE_APP = """
import dataclasses, json
from omegaconf import DictConfig
from mstar_resources import resolve
from mstar_resources.apps.hydra_app import hydra_app

@hydra_app("my-engine", config_name="engine", config_path="conf")
def main(cfg: DictConfig) -> None:
    print(json.dumps([r.as_json() for r in resolve(cfg.resources)]))

main()
"""


@pytest.mark.parametrize(
    "snippet", [m.group(1) for _, m in ENGINE_YAML], ids=[name(p) for p, _ in ENGINE_YAML]
)
def test_the_engine_snippet_runs_as_shown_and_writes_nothing(tmp_path, snippet):
    """The engine config, copied as shown beside the engine's own model group, composes, resolves,
    and leaves the working directory as it was."""
    engine = tmp_path / "engine"
    (engine / "conf" / "model").mkdir(parents=True)
    (engine / "conf" / "engine.yaml").write_text(snippet)
    (engine / "conf" / "model" / "llama3-8b.yaml").write_text("name: llama3-8b\n")
    (engine / "app.py").write_text(ENGINE_APP)
    work = tmp_path / "work"
    work.mkdir()
    done = run_cli(python=[sys.executable, str(engine / "app.py")], cwd=work)
    assert done.returncode == 0, done.stderr
    paths = [record["path"] for record in json.loads(done.stdout)]
    assert paths == ["attn.prefill", "attn.decode", "mla.decode"]
    assert list(work.iterdir()) == []  # no outputs/, no .hydra/, no log


WITHOUT_HYDRA = find_all(r"### Without Hydra\n.*?```python\n(.*?)```\n\n```text\n(.*?)```")


def test_the_docs_show_the_engine_config_and_the_plain_dict_example():
    assert ENGINE_YAML, "no doc has a yaml block under '### In an engine'"
    assert WITHOUT_HYDRA, "no doc has a python block and its output under '### Without Hydra'"


@pytest.mark.parametrize(
    ("code", "output"),
    [m.groups() for _, m in WITHOUT_HYDRA],
    ids=[name(p) for p, _ in WITHOUT_HYDRA],
)
def test_the_plain_dict_example_prints_what_the_docs_show(tmp_path, code, output):
    """An engine without Hydra: the snippet runs as shown and prints what it shows."""
    (tmp_path / "plain.py").write_text(code)
    done = run_cli(python=[sys.executable, str(tmp_path / "plain.py")], cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == output


def test_the_readme_is_a_quickstart():
    lines = len(TEXT[README].splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move details into docs/"


def test_the_readme_lists_every_docs_page():
    linked = set(re.findall(r"\]\((docs/[^)#\s]+\.md)", TEXT[README]))
    assert linked == {name(path) for path in DOCS if path != README}


def test_each_docs_page_links_back_to_the_readme():
    for path in DOCS[1:]:
        assert "](../README.md" in TEXT[path], name(path)


def without_fences(text: str) -> str:
    """``text`` without its fenced blocks, where a heading or a link is not one."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def without_code(text: str) -> str:
    """``text`` without its fenced blocks and code spans."""
    return re.sub(r"`[^`]*`", "", without_fences(text))


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of ``text``: lower case, punctuation dropped, spaces
    as hyphens, and -1, -2, ... after a repeated one."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} +(.+?) *#* *$", without_fences(text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        if count:
            seen.setdefault(f"{slug}-{count}", 1)
    return set(seen)


LINKS = [
    (path, target)
    for path in DOCS
    for target in re.findall(r"\]\(([^)\s]+)(?: \"[^\"]*\")?\)", without_code(TEXT[path]))
    if not re.match(r"[a-z][a-z0-9+.-]*:", target)  # https:, mailto:
]


def test_the_link_check_sees_every_doc():
    """Every doc links back to the README or on to a page, so none is checked vacuously."""
    assert {name(path) for path, _ in LINKS} == {name(path) for path in DOCS}


@pytest.mark.parametrize(
    ("path", "target"), LINKS, ids=[f"{name(path)}->{target}" for path, target in LINKS]
)
def test_each_relative_link_leads_to_a_file_and_heading_that_exist(path, target):
    file, _, anchor = target.partition("#")
    linked = (path.parent / file).resolve() if file else path
    assert linked.is_file(), f"{name(path)} links to {target}, and there is no {file}"
    assert ROOT in linked.parents, f"{name(path)} links to {target}, outside the repository"
    if anchor:
        assert anchor in anchors(linked.read_text()), f"{name(path)}: no heading for {target}"


@pytest.mark.parametrize("path", DOCS, ids=[name(path) for path in DOCS])
def test_no_doc_names_a_path_of_the_machine_it_was_written_on(path):
    found = [s for s in ("$OUT", ".gpu/", "/work/", "../shared") if s in TEXT[path]]
    assert found == [], f"{name(path)} names {found}"
