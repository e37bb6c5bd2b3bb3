"""benchmarks/machines/ and benchmarks/probes/: every command run on a tiny setting, its printed or written values
checked (hand counts, the arithmetic between its rows, plausible ranges); and the direction of imports in
benchmarks/. `wire` needs root and network namespaces: tests/launch/test_wire.py."""

import ast
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from benchmarks.harness import commands
from benchmarks.machines import scaling
from benchmarks.machines.__main__ import COMMANDS as MACHINES
from benchmarks.probes.__main__ import COMMANDS as PROBES
from tests.support.paths import ROOT_PATH as REPO_ROOT

# mlp on 64 inputs (benchmarks.machines.traffic's shape): Dense 64->256, 256->128, 128->10, float32
MLP_BYTES = 4 * (64 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10)


def _run(*args: str, timeout: float = 300) -> str:
    """stdout of `python ARGS` from the repository; fails with its stderr's tail when it fails."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [sys.executable, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


# --- the layout of benchmarks/ --------------------------------------------------------------------------------

# group -> the groups its modules may import (`figures` is benchmarks/figures.py, `main` benchmarks/__main__.py)
ALLOWED = {
    "harness": set(),
    "input": {"harness"},
    "figures": {"harness", "input"},
    "machines": {"harness"},
    "probes": {"harness", "figures"},
    "main": {"harness", "input", "figures"},
}


def _group(path: pathlib.Path) -> str:
    parts = path.relative_to(REPO_ROOT / "benchmarks").parts
    return {"figures.py": "figures", "__main__.py": "main", "__init__.py": "package"}.get(parts[0], parts[0])


def _imported_groups(path: pathlib.Path) -> set[str]:
    """The benchmark groups `path` imports, at any depth (imports inside functions count)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "benchmarks" and len(parts) > 1:
                found.add({"figures": "figures", "__main__": "main"}.get(parts[1], parts[1]))
    return found


@pytest.mark.quick
def test_benchmark_groups_import_one_way():
    """harness <- input <- figures <- probes, __main__; machines on harness alone; nothing imports machines or
    probes from outside: no import circle between groups can form."""
    modules = sorted((REPO_ROOT / "benchmarks").rglob("*.py"))
    assert {_group(p) for p in modules} == {*ALLOWED, "package"}
    for path in modules:
        group = _group(path)
        wrong = _imported_groups(path) - ALLOWED.get(group, set()) - {group}
        assert not wrong, f"{path.relative_to(REPO_ROOT)} ({group}) imports {sorted(wrong)}"


@pytest.mark.quick
def test_each_group_runs_its_registered_commands_and_lists_them(capsys):
    for group, registered in (("machines", MACHINES), ("probes", PROBES)):
        found = {p.stem for p in (REPO_ROOT / "benchmarks" / group).glob("*.py")} - {"__init__", "__main__"}
        assert set(registered) == found and all(m == f"benchmarks.{group}.{n}" for n, m in registered.items())
        assert commands.dispatch(f"python -m benchmarks.{group}", registered, []) == 0
        listed = capsys.readouterr().out.splitlines()
        assert [line.split()[0] for line in listed[3:]] == list(registered)
        assert commands.dispatch("prog", registered, ["nothing"]) == 2
        assert "unknown command 'nothing'" in capsys.readouterr().err
    assert commands.summary(MACHINES["scaling"]).startswith("the paper model of M nodes x 8 GPUs for ResNet-50")


# --- machines -------------------------------------------------------------------------------------------------


@pytest.mark.quick
def test_scaling_counts_the_bytes_of_a_phase_by_hand_and_reads_the_recorded_excess(capsys):
    variable_bytes = 25_557_032 * 4
    assert scaling.phase_bytes(2, "spread") == 0.5 and scaling.phase_bytes(4, "spread") == 0.75
    assert scaling.phase_bytes(4, "cpu") == 3
    row = scaling.project(2, 0.1, 100, "spread", excess=1.0, overlap=0.0)
    assert row["mb_per_direction"] == pytest.approx(variable_bytes / 1e6)  # 2 x (M-1)/M x the bytes
    assert row["transfer_ms"] == pytest.approx(1e3 * 2 * 0.5 * variable_bytes / 12.5e9)  # two phases at 100 Gb/s
    assert row["efficiency"] == pytest.approx(0.1 / (0.1 + row["transfer_ms"] / 1e3) * 7.9 / 8)
    hidden = scaling.project(2, 0.1, 100, "spread", excess=1.0, overlap=1.0)  # the gradient phase hidden
    assert hidden["transfer_ms"] == pytest.approx(row["transfer_ms"] / 2)
    # the worst resnet50 `spread` cell of results/wire.json, as results/machines.md quotes it
    assert scaling.measured_excess() == pytest.approx(1.071, abs=5e-4)
    assert commands.dispatch("python -m benchmarks.machines", MACHINES, ["scaling"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("measured excess over the bound 1.071")
    assert len([line for line in out if re.match(r"\| \d x 8 \|", line)]) == 3 * 2 * 2 * 3  # nodes, links, ...


def test_traffic_counts_the_mlps_bytes_through_the_busiest_device(tmp_path):
    """N = 2: `gpu` and `spread` move the model's bytes once through the busiest device, `cpu` (the host
    sends both towers the variables) twice; a few hundred bytes of input come on top."""
    out = tmp_path / "traffic.json"
    _run("-m", "benchmarks.machines", "traffic", "--models=mlp", "--towers=2", f"--out={out}")
    rows = {row["placement"]: row for row in json.loads(out.read_text())}
    assert list(rows) == ["gpu", "cpu", "spread"]
    for placement, times in (("gpu", 1), ("cpu", 2), ("spread", 1)):
        row = rows[placement]
        assert row["model_bytes"] == row["ideal_bytes"] == MLP_BYTES, row  # ideal: 2(N-1)/N = 1 x the bytes
        assert times * MLP_BYTES <= row["busiest_bytes"] <= times * MLP_BYTES * 1.01, row
        assert row["unknown_edges"] == 0
    assert rows["cpu"]["busiest_device"].endswith("CPU:2")  # the host, device N


def test_multinode_times_two_tasks_against_one_and_derives_the_ms_they_add(tmp_path):
    """By default (`--fusion=both`) the 2-task layout runs with --fuse_transfers off and on, in the same run."""
    out = tmp_path / "multinode.json"
    _run("-m", "benchmarks.machines", "multinode", "--model=mlp", "--steps=20", "--repeats=1", "--pairs=2x1",
         f"--out={out}")  # fmt: skip
    results = json.loads(out.read_text())
    assert (results["model"], results["steps"], results["global_batch_size"]) == ("mlp", 20, 128)
    measured = results["mlp_throughput"]
    assert measured["pinned"] is True and set(measured["examples_per_sec"]) == {"2x1", "2x1-fused", "1x2"}
    two, fused, one = (measured["median"][name] for name in ("2x1", "2x1-fused", "1x2"))
    assert [two, fused, one] == [measured["examples_per_sec"][name][0] for name in ("2x1", "2x1-fused", "1x2")]
    assert measured["ratios"] == {
        "2x1_vs_1x2": pytest.approx(two / one),
        "2x1-fused_vs_1x2": pytest.approx(fused / one),
        "2x1-fused_vs_2x1": pytest.approx(fused / two),
    }
    assert measured["added_ms_per_step"] == {
        "2x1_vs_1x2": pytest.approx(1000 * 128 * (1 / two - 1 / one)),
        "2x1-fused_vs_1x2": pytest.approx(1000 * 128 * (1 / fused - 1 / one)),
    }
    assert 500 < one < 1e6 and 0.05 < two / one < 2.0 and 0.05 < fused / one < 2.0  # 0.1-250 ms a step; gRPC


# --- probes ---------------------------------------------------------------------------------------------------


def _ms_rows(out: str) -> dict[str, tuple[float, ...]]:
    """`name  wall-ms  cpu-ms` lines of a probe's table, by name."""
    rows = {}
    for line in out.splitlines():
        if match := re.match(r"^(\S.*?)\s+(-?\d+\.\d+)\s+(-?\d+\.\d+)$", line):
            rows[match[1]] = (float(match[2]), float(match[3]))
    return rows


def test_step_overhead_times_four_loops_of_the_steps_asked():
    out = _run("-m", "benchmarks.probes", "step_overhead", "--steps=3", "--windows=1")
    rows = [re.match(r"^(.+?)\s+(\d+\.\d+) ms/step  \((\d+) updates a window\)$", line) for line in out.splitlines()]
    rows = [row for row in rows if row]
    names = ["plain", "plain in-graph loop", "towerflow, 1 per call", "towerflow, auto"]
    assert [row[1] for row in rows] == names
    assert [int(row[3]) for row in rows] == [3] * 4  # every loop's optimizer applied 3 updates a window
    # a 128-example cnn step on logical CPUs: ~6-20 ms on 2 cores; a loop that skipped its steps is far below
    assert all(1.0 < float(row[2]) < 1000 for row in rows), out


def test_async_overhead_rows_and_their_differences():
    out = _run("-m", "benchmarks.probes", "async_overhead", "--towers=2", "--updates=4", "--windows=1")
    rows = _ms_rows(out)
    loops = ["sync, per micro-batch", "async, 2 towers", "1 tower: compute only", "1 tower: compute + apply",
             "1 tower: 1 update per call"]  # fmt: skip
    assert list(rows) == [*loops, "apply (in graph)", "a call per update"], out
    for name in loops:  # wall and CPU ms per update of 64 cnn examples
        assert 0.2 < rows[name][0] < 2000 and 0.05 < rows[name][1] < 2000, (name, rows[name])
    for difference, (more, less) in (
        ("apply (in graph)", ("1 tower: compute + apply", "1 tower: compute only")),
        ("a call per update", ("1 tower: 1 update per call", "1 tower: compute + apply")),
    ):
        for column in (0, 1):
            assert rows[difference][column] == pytest.approx(rows[more][column] - rows[less][column], abs=2e-3)


def test_keras_spe_times_each_value_against_one_and_the_accuracy_metric():
    from benchmarks.figures import KERAS_STEPS_PER_EXECUTION
    from benchmarks.probes import keras_spe

    figures = keras_spe.spe_figures(["mlp-digits-b32"], [2, 8], [1, 2])
    spe = [f"keras_fit{n}_spe{s}_vs_spe1" for n in (1, 2) for s in (2, 8)]
    assert [f.name for f in figures] == [*spe, "keras_fit1_loss_only_vs_accuracy", "keras_fit2_loss_only_vs_accuracy"]
    assert {(f.b.steps_per_execution, f.b.towers) for f in figures[:4]} == {(1, 1), (1, 2)}
    tuned = KERAS_STEPS_PER_EXECUTION["mlp-digits-b32"]
    assert [(f.a.keras_accuracy, f.b.keras_accuracy, f.a.steps_per_execution) for f in figures[4:]] == [
        (False, True, tuned)
    ] * 2
    out = _run("-m", "benchmarks.probes", "keras_spe", "--settings=mlp-digits-b32", "--values=2", "--devices=1",
               "--size=smoke")  # fmt: skip
    pattern = r"^mlp-digits-b32\s+(\S+)\s+A\s+([\d,]+) ex/s\s+B\s+([\d,]+) ex/s\s+ratio A/B (\d+\.\d+)"
    rows = [match.groups() for line in out.splitlines() if (match := re.match(pattern, line))]
    assert [row[0] for row in rows] == ["keras_fit1_spe2_vs_spe1", "keras_fit1_loss_only_vs_accuracy"], out
    for _, a, b, ratio in rows:
        a, b = float(a.replace(",", "")), float(b.replace(",", ""))
        assert float(ratio) == pytest.approx(a / b, abs=1.5e-3) and 0.2 < float(ratio) < 5
        assert 1_000 < b < 10_000_000  # examples/s of a 32-example mlp step


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """Profiler traces of 3 steps each: A = relu(matmul(x, x)), B = matmul(x, x)."""
    import tensorflow as tf

    x = tf.ones([32, 32])
    steps = {"a": tf.function(lambda x: tf.nn.relu(tf.matmul(x, x))), "b": tf.function(lambda x: tf.matmul(x, x))}
    dirs = {}
    for side, step in steps.items():
        step(x)  # traced before the profiler starts
        dirs[side] = str(tmp_path_factory.mktemp(f"trace-{side}"))
        tf.profiler.experimental.start(dirs[side])
        try:
            for _ in range(3):
                step(x).numpy()
        finally:
            tf.profiler.experimental.stop()
    return dirs


def test_profile_summary_counts_each_op_type_per_step(traces, capsys):
    from benchmarks.probes import profile_summary

    _, counts = profile_summary.by_op_type(profile_summary.load_host_events(traces["a"]))
    matmul = next(op for op in counts if op.endswith("MatMul"))  # _MklMatMul with oneDNN
    assert counts == {matmul: 3, "Relu": 3}
    argv = ["profile_summary", traces["a"], traces["b"], "--steps=3"]
    assert commands.dispatch("python -m benchmarks.probes", PROBES, argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "per step (3 steps): A 2 ops, B 1 ops"
    relu = next(line.split() for line in lines if line.startswith("Relu "))
    assert (relu[2], relu[4]) == ("1", "0") and float(relu[1]) > 0 and float(relu[5]) == pytest.approx(float(relu[1]))
