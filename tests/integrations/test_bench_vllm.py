"""scripts/bench_vllm.py where there is no vLLM: its runs alternate ABBA per configuration, bad
arguments end as argparse ends them (status 2), and its table gives the medians, their ratio and
whether every run generated the same tokens."""

from __future__ import annotations

import importlib.util

from tests.scripts import load_script, run_script


def test_the_dry_run_lists_the_runs_abba_per_configuration():
    done = run_script("bench_vllm", "--dry-run", "--rounds", "3")
    assert done.returncode == 0, done.stderr
    names = [line.split(":")[0] for line in done.stdout.splitlines() if line.startswith("L")]
    groups = ["L3-S256", "L3-S512", "L16-S256", "L16-S512"]
    abba = ["vllm-0", "plugin-0", "plugin-1", "vllm-1", "vllm-2", "plugin-2"]
    assert names == [f"{g}/{run}" for g in groups for run in abba]
    assert "llama3-8b-16l, MSTAR_RESOURCES_VLLM=auto, max_num_seqs 512" in done.stdout


def test_bad_arguments_exit_2_naming_the_option():
    for args, option in ((["--rounds", "0"], "--rounds"), (["--depths", "4"], "--depths"),
                         (["--max-num-seqs", "-1"], "--max-num-seqs")):  # fmt: skip
        done = run_script("bench_vllm", "--dry-run", *args)
        assert done.returncode == 2 and option in done.stderr, (args, done.stderr)


def test_without_vllm_it_refuses_to_run():
    if importlib.util.find_spec("vllm") is None:
        done = run_script("bench_vllm", "--rounds", "1", "--depths", "3", "--max-num-seqs", "8")
        assert done.returncode == 2 and "vLLM is not installed" in done.stderr


def _result(seconds: float, digest: str, kv: int) -> dict:
    return {"ok": True, "generate_s": seconds, "digest": digest,
            "kv_line": f"GPU KV cache size: {kv:,} tokens"}  # fmt: skip


def test_the_table_gives_medians_their_ratio_and_the_tokens():
    bench = load_script("bench_vllm")
    configs = [bench.Config(3, 256), bench.Config(16, 512)]
    results = {
        "L3-S256/vllm-0": _result(1.0, "aa", 1000), "L3-S256/plugin-0": _result(1.2, "aa", 990),
        "L3-S256/plugin-1": _result(1.1, "aa", 990), "L3-S256/vllm-1": _result(1.1, "aa", 1000),
        "L3-S256/vllm-2": _result(1.3, "aa", 1000), "L3-S256/plugin-2": _result(0.9, "aa", 990),
        "L16-S512/vllm-0": _result(2.0, "bb", 500), "L16-S512/plugin-0": _result(2.0, "cc", 480),
        "L16-S512/vllm-1": {"ok": False, "error": "no result within 400 s"},
    }  # fmt: skip
    lines = bench.table(configs, results).splitlines()
    rows = {line.split("  ")[0]: line.split() for line in lines}
    small = rows["3 layers, max_num_seqs 256"]
    # medians 1.1 and 1.1: ratio 1.000; rounds 1.2, 1.0, 0.692; six runs, one digest; KV tokens
    assert small[4:12] == ["3+3", "1.100", "1.100", "1.000", "1.000", "yes", "1,000", "990"]
    assert small[12:] == ["-/-", "-/-", "-"]  # no clock in these runs
    large = rows["16 layers, max_num_seqs 512"]
    assert large[4:10] == ["1+1", "2.000", "2.000", "1.000", "1.000", "NO"]  # failed: left out


def test_each_rounds_ratio_cancels_a_drift_of_the_hosts_speed():
    """The host twice as slow for the second round, and the plugin's third run alone slow: the
    ratio of medians says 2.0, the rounds' ratios (1.0, 1.0, 2.0) say 1.0."""
    bench = load_script("bench_vllm")
    config = bench.Config(3, 256)
    times = {"vllm-0": 1.0, "plugin-0": 1.0, "plugin-1": 2.0, "vllm-1": 2.0, "vllm-2": 1.0,
             "plugin-2": 2.0}  # fmt: skip
    results = {f"L3-S256/{run}": _result(t, "aa", 1000) for run, t in times.items()}
    assert bench.pair_ratios(config, results) == [1.0, 1.0, 2.0]
    row = bench.table([config], results).splitlines()[1].split()
    assert row[7:9] == ["2.000", "1.000"]
    results["L3-S256/vllm-1"] = {"ok": False, "error": "Error in memory profiling"}
    assert bench.pair_ratios(config, results) == [1.0, 2.0]  # a round without its pair: left out


def _clocked(seconds: float, inner_us: float, added_us: float, share: float) -> dict:
    clock = {"decode_plans": 100, "flashinfer_plan_us": inner_us, "added_median_us": added_us,
             "added_per_plan_us": added_us, "added_of_generate": share}  # fmt: skip
    return _result(seconds, "aa", 1000) | {"decode_plan_clock": clock}


def test_the_table_gives_the_decode_plans_clock_both_ways():
    bench = load_script("bench_vllm")
    results = {
        "L3-S256/vllm-0": _clocked(1.0, 60.0, 4.0, 0.0001),
        "L3-S256/vllm-1": _clocked(1.0, 70.0, 6.0, 0.0001),
        "L3-S256/plugin-0": _clocked(1.0, 65.0, 12.0, 0.002),
        "L3-S256/plugin-1": _clocked(1.0, 65.0, 14.0, 0.004),
    }  # fmt: skip
    row = bench.table([bench.Config(3, 256)], results).splitlines()[1].split()
    # FlashInfer's plan and the added time without/with the plugin, and the plugin's share of
    # its generation less the clock's own 5 us a plan: 0.2% x 7/12 and 0.4% x 9/14, their median
    assert row[-3:] == ["65.0/65.0", "5.0/13.0", "0.19%"]


def test_each_configurations_runs_alternate_vllm_and_the_plugin_abba():
    bench = load_script("bench_vllm")
    configs = [bench.Config(3, 256), bench.Config(16, 512)]
    names = [case.name for _, case in bench.order(configs, 2)]
    runs = ("vllm-0", "plugin-0", "plugin-1", "vllm-1")
    assert names == [f"{g}/{run}" for g in ("L3-S256", "L16-S512") for run in runs]


def test_the_host_lines_give_each_sides_cpu_time_and_the_hosts_steal(monkeypatch):
    bench = load_script("bench_vllm")
    monkeypatch.setattr(bench.os, "cpu_count", lambda: 4)

    def timed(cpu: list[float], steal: list[float]) -> dict:
        # The first generation warms up: its figures are left out.
        seconds = {"generate_each_s": [9.0, 1.0, 1.0], "generate_cpu_s": cpu, "host_steal_s": steal}
        return _result(1.0, "aa", 1000) | seconds

    results = {
        "L3-S256/vllm-0": timed([9.0, 1.0, 1.2], [9.0, 0.4, 0.4]),
        "L3-S256/plugin-0": timed([9.0, 1.2, 1.2], [9.0, 0.0, 0.0]),
        "L3-S256/vllm-1": {"ok": False, "error": "no result within 400 s"},
    }
    configs = [bench.Config(3, 256), bench.Config(16, 512)]
    (line,) = bench.host_lines(configs, results)  # nothing measured at 16 layers: no line
    assert line.startswith("3 layers, max_num_seqs 256: CPU time of a generation 1.100 s (vLLM)")
    assert "1.200 s (plugin), ratio 1.091" in line
    assert "steal 10.0%/0.0% of the CPUs' time" in line  # 0.8 s of 2 s on 4 CPUs
