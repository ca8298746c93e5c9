"""How resolve() and build_pools() scale with the number of declared resources, against Hydra.

    python scripts/bench_resolver_scale.py                       # 10 ... 1,000 resources
    python scripts/bench_resolver_scale.py --full                # ... and 10,000 (minutes)
    python scripts/bench_resolver_scale.py --sizes 10 100 --repeats 1 --png /tmp/scale.png
    python scripts/bench_resolver_scale.py --full --png docs/bench_resolver_scale.png  # docs'

For each size, one tree of that many resources (nested two levels deep, as an engine's would be)
is written as YAML, composed with Hydra's Compose API, then resolved and turned into pools (on the
CPU: pools allocate nothing until a workspace is asked for). Times are medians over repeats, all
taken in this run; the ratios compare the resolver's work with composing the same tree.

It draws a figure only with ``--png`` (matplotlib: the ``bench`` extra), into a folder that exists.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from mstar_resources import build_pools, resolve

from _args import count, run_main
from _plot import add_png_option, check_png, pyplot, save

SIZES = [10, 100, 1_000]
FULL_SIZE = 10_000  # composing it alone takes seconds a repeat: only in the full sweep


def tree(size: int) -> dict[str, object]:
    """``size`` resources under ``resources.group_<i // 100>.res_<i>``, alternately eager and
    graph-captured, half of them declaring a floor."""
    resources: dict[str, dict[str, dict[str, object]]] = {}
    for i in range(size):
        node: dict[str, object] = {
            "owner": f"layer{i}",
            "labels": ["prefill"] if i % 2 else ["decode", "verify"],
            "cg_slots": [] if i % 2 else [0, 1],
        }
        if i % 4 < 2:
            node["declared_mb"] = 1 + i % 64
        resources.setdefault(f"group_{i // 100}", {})[f"res_{i}"] = node
    return {"resources": resources}


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """The median of ``repeats`` timed calls, after one untimed call: the first call pays for
    what is done once a process (build_pools' first imports torch, some 1 s), not per call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(size: int, repeats: int, workdir: Path) -> dict[str, float]:
    config_dir = workdir / f"tree_{size}"
    config_dir.mkdir()
    (config_dir / "engine.yaml").write_text(yaml.safe_dump(tree(size)))
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        compose_s = median_seconds(lambda: compose(config_name="engine"), repeats)
        node = compose(config_name="engine").resources
    env: dict[str, str] = {}  # the same floors whatever this machine's environment says
    records = resolve(node, env=env)
    assert len(records) == size
    return {
        "compose": compose_s,
        "resolve": median_seconds(lambda: resolve(node, env=env), repeats),
        "build_pools": median_seconds(lambda: build_pools(node, "cpu", env=env), repeats),
    }


def plot(results: dict[int, dict[str, float]], png: Path) -> None:
    plt = pyplot()
    sizes = sorted(results)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for key, style in (("compose", "o-"), ("resolve", "s-"), ("build_pools", "^-")):
        ax.loglog(sizes, [results[n][key] * 1e3 for n in sizes], style, label=key)
    ax.set_xlabel("declared resources")
    ax.set_ylabel("median time (ms)")
    ax.set_title("Resolver scale vs. Hydra compose of the same tree")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    save(fig, png)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        type=count(FULL_SIZE),
        nargs="+",
        default=SIZES,
        help=f"tree sizes, at most {FULL_SIZE:,} (default 10 100 1000)",
    )
    parser.add_argument(
        "--full", action="store_true", help=f"the full sweep: also {FULL_SIZE:,} resources"
    )
    parser.add_argument(
        "--repeats", type=count(1000), default=5, help="repeats per median (default 5)"
    )
    add_png_option(parser)
    options = parser.parse_args(argv)
    check_png(parser, options.png)
    sizes = sorted(set(options.sizes) | ({FULL_SIZE} if options.full else set()))
    results = {}
    with tempfile.TemporaryDirectory() as workdir:
        for size in sizes:
            results[size] = measure(size, options.repeats, Path(workdir))
    print(
        f"{'resources':>9} {'compose ms':>11} {'resolve ms':>11} {'build_pools ms':>15} "
        f"{'resolve/compose':>16} {'build_pools/compose':>20}"
    )
    for size, r in results.items():
        print(
            f"{size:>9,} {r['compose'] * 1e3:>11.2f} {r['resolve'] * 1e3:>11.2f} "
            f"{r['build_pools'] * 1e3:>15.2f} {r['resolve'] / r['compose']:>16.3f} "
            f"{r['build_pools'] / r['compose']:>20.3f}"
        )
    if options.png:
        plot(results, options.png)
    return 0


if __name__ == "__main__":
    run_main(main)
