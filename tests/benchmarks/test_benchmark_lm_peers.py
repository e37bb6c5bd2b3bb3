"""The language model against its peers (issue #45, benchmarks/harness/peers.py): the figures' wiring, the
setting's sizes, the FLOPs count behind MFU and the MFU arithmetic. The peers themselves (Keras Hub, PyTorch)
are benchmark-only extras that CI does not install: what they measure is in benchmarks/results/lm-peers.md."""

import os
import pathlib

import pytest

from benchmarks import figures
from benchmarks.harness import mfu, report
from benchmarks.harness.plan import SETTINGS, SIZES

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.quick
def test_the_peers_setting_puts_towerflow_against_keras_hub_and_nanogpt_at_each_tower_count():
    found = figures.figures(SETTINGS["lm-peers"], SIZES["quick"])
    assert tuple(f.name for f in found) == figures.PEER_NAMES
    assert [(f.a.kind, f.a.towers) for f in found] == [("towerflow", n) for n in (1, 2, 4, 1, 2, 4, 1)]
    assert [(f.b.kind, f.b.towers) for f in found[:3]] == [("keras_hub_fit", n) for n in (1, 2, 4)]
    assert [(f.b.kind, f.b.towers, f.b.intra_op_threads) for f in found[3:]] == [("nanogpt_torch", 1, 0)] * 3 + [
        ("nanogpt_torch", 1, 1)
    ]
    assert [f.target for f in found] == [1.0, 1.0, 1.0, None, None, None, None]
    assert figures.select(found, ["lm_peers"], SIZES["quick"]) == found
    assert figures.select(found, ["lm_tower2_vs_nanogpt_torch"], SIZES["quick"]) == found[4:5]
    # the char-token setting keeps its Keras fit figures
    assert tuple(f.name for f in figures.figures(SETTINGS["lm-pydoc"], SIZES["quick"])) == figures.TASK_NAMES


@pytest.mark.quick
def test_no_package_of_the_trainer_imports_a_peer():
    """No import statement of the trainer's packages names torch or keras_hub (models/layout.py may name a Keras
    Hub block's module in its built-in plans: a string, matched against a model's layers, never imported)."""
    import ast

    for package in ("trainer", "tasks", "models", "data", "launch"):
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
                names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                assert not [n for n in names if n.split(".")[0] in ("torch", "keras_hub")], (path, names)
            assert "importlib" not in path.read_text() or "keras_hub" not in path.read_text(), path
    setup = (REPO / "setup.cfg").read_text()
    requires = setup.split("install_requires =")[1].split("\n\n")[0]
    assert "torch" not in requires and "keras-hub" not in requires
    assert "peers =" in setup


def test_the_towerflow_side_of_the_peers_setting_has_its_sizes():
    from benchmarks.harness import lm

    task = lm.make_task(SETTINGS["lm-peers"], {"train": "unused-*.tfrecord"})
    assert (task.layers, task.heads, task.width, task.context) == (4, 4, 256, 128)
    assert SETTINGS["lm-peers"].global_batch_size % 4 == 0  # 4 towers


def test_flops_per_token_counts_the_matmul_weights_of_the_built_model():
    from models.transformer import parameter_count, transformer_lm

    vocab, layers, width, context = 50, 2, 16, 8
    model = transformer_lm(vocab, layers, heads=2, width=width, context=context)
    kernels = [w for w in model.weights if len(w.shape) == 2 and "embedding" not in w.path]
    assert len(kernels) == 6 * layers + 1  # q, k, v, output, MLP in and out per block; the head
    counted = sum(w.shape[0] * w.shape[1] for w in kernels)
    assert mfu.matmul_weights(vocab, layers, width) == counted
    assert mfu.flops_per_token(vocab, layers, width, context) == 6 * counted + 12 * layers * context * width
    # the rest of the weights (embedding, positions, biases, LayerNorms) are not in N
    assert model.count_params() == parameter_count(vocab, layers, width, context, "learned") > counted


def test_the_tensorflow_matmul_peak_is_a_rate_per_repeat_on_the_pools_threads():
    rates, threads = mfu.tensorflow_peak(size=64, repeats=3)
    assert len(rates) == 3 and all(1e6 < rate < 1e14 for rate in rates)
    assert threads == len(os.sched_getaffinity(0))  # the worker's default intra-op pool


def _record(status="ok", a_rate=10.0, b_rate=5.0, a_peak=100e9, b_peak=50e9):
    side = lambda rate, peak: {  # noqa: E731
        "label": "x", "median_examples_per_sec": rate, "tokens_per_example": 128, "flops_per_token": 1e7,
        "parameters": 1000, "matmul_peak_flops": peak, "peak_framework": "torch",
    }  # fmt: skip
    record = {"name": "f", "setting_text": "s", "status": status, "a": side(a_rate, a_peak), "b": side(b_rate, b_peak)}
    return {**record, "error": "Traceback\nValueError: x"} if status == "error" else record


@pytest.mark.quick
def test_mfu_divides_each_sides_model_flops_by_the_runs_largest_peak():
    records = [_record(), _record(b_peak=200e9), _record(status="error", a_peak=900e9)]
    assert mfu.annotate(records) == 200e9  # the failed figure's peak does not count
    first = records[0]
    assert first["a"]["tokens_per_sec"] == 1280 and first["b"]["tokens_per_sec"] == 640
    assert first["a"]["mfu"] == pytest.approx(1280 * 1e7 / 200e9)
    assert first["b"]["mfu"] == pytest.approx(first["a"]["mfu"] / 2)
    assert "mfu" not in records[2]["a"]
    assert "MFU 6.4%" in report.legend(records)[0]
    assert mfu.annotate([{"status": "ok", "a": {}, "b": {}}]) is None
