"""`--parameter_device=spread`: same bits as one parameter device, balanced and stable, less traffic."""

import json
import os
import subprocess
import sys
from unittest import mock

import keras
import tensorflow as tf

from tasks.classify import Classify
from tests.support.paths import ROOT as REPO
from trainer.loop import run as run_lib
from trainer.loop.build import build
from trainer.loop.inputs import PlacedIterator
from trainer.loop.run import train
from trainer.outputs import report
from trainer.settings.config import RunConfig
from trainer.step.core import spread
from trainer.step.sync.sync_update import SyncUpdate
from trainer.step.transfers import traffic
from trainer.system import devices

CLASSIFY = Classify(RunConfig())  # (features, labels) batches, cross-entropy

STEPS = 6


def _train(make_config, tmp_path, name, placement, num_towers, built=None, **loop):
    """The run's metrics; with a list `built`, the trainer the run built and trained is appended to it."""
    config = make_config(
        model_dir=tmp_path / name,
        towers={"num_towers": num_towers, "micro_batches": 4, "parameter_device": placement},
        loop={"train_steps": STEPS, **loop},
    )
    if built is None:
        return train(config)

    def recorded(*args, **kwargs):
        built.append(build(*args, **kwargs))
        return built[-1]

    with mock.patch.object(run_lib, "build", recorded):
        return train(config)


def _where(trainer) -> tuple[list[str], list[tuple[str, ...]], str]:
    """Where a built run's state sits ("CPU:i"): each model variable; each trainable variable followed by its
    optimizer slots (Keras names a slot after its variable's path: `<path with _>_momentum`); the optimizer's
    step counter."""
    optimizer = trainer.optimizer
    slots = {v.name: v.value.device[-5:] for v in optimizer.variables}
    with_slots = []
    for variable in trainer.model.trainable_variables:
        key = variable.path.replace("/", "_")
        found = [slots[f"{key}_{kind}"] for kind in ("momentum", "velocity") if f"{key}_{kind}" in slots]
        with_slots.append((variable.value.device[-5:], *found))
    return [v.value.device[-5:] for v in trainer.model.variables], with_slots, slots["iteration"]


def _placed(trainer) -> list[str]:
    """Of the trainer a `_train` run built and trained: checks each momentum slot sits with its variable;
    returns the devices of the model's variables."""
    variables, with_slots, iterations = _where(trainer)
    assert with_slots and all(len(set(placed)) == 1 for placed in with_slots), with_slots
    assert {len(placed) for placed in with_slots} == {2}  # momentum: one slot per variable
    assert iterations == "CPU:0"
    return variables


def test_spread_gives_the_weights_of_one_parameter_device(make_config, tmp_path):
    """cnn has BatchNorm and Dropout; K = 4 for every N, so all runs sum the same chains of adds. The runs are
    placed as asked (not all on one device, which would give these bits trivially)."""
    initial = report.weights_sha256(build(make_config(model_dir=tmp_path / "init")).model.variables)
    built = {("gpu", 2): [], ("spread", 4): []}  # the trainers of these runs, to read where their state sits
    layouts = [("gpu", 2), ("cpu", 4), ("spread", 1), ("spread", 2), ("spread", 4)]
    runs = {(p, n): _train(make_config, tmp_path, f"{p}{n}", p, n, built.get((p, n))) for p, n in layouts}
    hashes = {key: m["weights_sha256"] for key, m in runs.items()}
    assert len(set(hashes.values())) == 1, hashes
    assert hashes["spread", 4] != initial  # trained: equal hashes of untouched weights prove nothing
    # spread really spreads: at N = 4 every tower holds variables (and their slots), and metrics.json says so
    spread4 = _placed(*built["spread", 4])
    assert sorted(set(spread4)) == ["CPU:0", "CPU:1", "CPU:2", "CPU:3"]
    assert max(spread4.count(d) for d in set(spread4)) < len(spread4) / 2  # no tower holds most of them
    on_disk = json.loads((tmp_path / "spread4" / "metrics.json").read_text())
    assert on_disk["placement"] == "spread"
    assert [d[-5:] for d in on_disk["parameter_devices"]] == ["CPU:0", "CPU:1", "CPU:2", "CPU:3"]
    # one parameter device holds everything on the first tower's device
    assert set(_placed(*built["gpu", 2])) == {"CPU:0"}
    assert [d[-5:] for d in runs["gpu", 2]["parameter_devices"]] == ["CPU:0"]


def test_slots_live_with_their_variables(make_config, tmp_path):
    """Adam's two slots per variable are made on the variable's device, spread over N = 3 towers."""
    config = make_config(
        model_dir=tmp_path / "r",
        towers={"num_towers": 3, "micro_batches": 3, "parameter_device": "spread", "global_batch_size": 63},
        optimizer={"name": "adam", "learning_rate": 0.001},
    )
    variables, with_slots, iterations = _where(build(config))
    assert sorted(set(variables)) == ["CPU:0", "CPU:1", "CPU:2"] and iterations == "CPU:0"
    assert {len(placed) for placed in with_slots} == {3}  # the variable, its momentum and its velocity
    for placed in with_slots:
        assert len(set(placed)) == 1, placed


def test_resume_under_another_placement_gives_the_same_bits(make_config, tmp_path):
    full = _train(make_config, tmp_path, "run", "gpu", 2, checkpoint_every_steps=3)
    checkpoints = tmp_path / "run" / "checkpoints"
    # A run killed after its step-3 checkpoint: step 6's is gone, the state file names ckpt-3.
    for name in os.listdir(checkpoints):
        if name.startswith(f"ckpt-{STEPS}."):
            os.remove(checkpoints / name)
    tf.compat.v1.train.update_checkpoint_state(str(checkpoints), str(checkpoints / "ckpt-3"))
    resumed = _train(make_config, tmp_path, "run", "spread", 4, checkpoint_every_steps=3)
    assert resumed["attempts"][-1]["resumed_from_step"] == 3
    assert resumed["global_step"] == STEPS
    assert resumed["weights_sha256"] == full["weights_sha256"]


def test_async_spread_learns_the_digits(make_config):
    config = make_config(
        deterministic=False,
        towers={"num_towers": 2, "update_mode": "async", "parameter_device": "spread", "global_batch_size": 128},
        loop={"train_steps": 1000, "eval_every_steps": 1000, "log_every_steps": 500},
    )
    metrics = train(config)
    assert metrics["global_step"] == 1000
    assert len(metrics["parameter_devices"]) == 2
    assert metrics["eval_accuracy"] >= 0.95


def test_assign_is_greedy_by_bytes_in_order():
    # 10 -> 0; then device 1 is lighter until it catches up; on the 10 / 10 tie the lowest index wins.
    assert spread.assign([10, 3, 3, 3, 1, 4], 2) == [0, 1, 1, 1, 1, 0]
    assert spread.assign([5, 5, 5], 3) == [0, 1, 2]
    # mirrored variables (flagged) go after the others, which are then balanced among themselves: 3+3 | 3+1+4
    assert spread.assign([10, 3, 3, 3, 1, 4], 2, [True, False, False, False, False, False]) == [0, 0, 1, 0, 1, 1]


_PRINT_ASSIGNMENT = """
import json, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
import keras, models
from trainer.step.core import spread
towers = tuple(f"/device:CPU:{i}" for i in range(4))
build = lambda: models.build_model("resnet20", (32, 32, 3), 10)
model = spread.build_spread(build, towers, reseed=lambda: keras.utils.set_random_seed(0))
print(json.dumps([[v.path, v.value.device, spread.variable_bytes(v)] for v in model.variables]))
"""


def test_assignment_is_balanced_and_the_same_in_every_process():
    def assignment():
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)
        out = subprocess.run([sys.executable, "-c", _PRINT_ASSIGNMENT], cwd=REPO, env=env, capture_output=True)
        assert out.returncode == 0, out.stderr.decode()[-2000:]
        return json.loads(out.stdout.decode().splitlines()[-1])

    first, second = assignment(), assignment()
    assert first == second
    loads = {}
    for _, device, size in first:
        loads[device] = loads.get(device, 0) + size
    assert len(loads) == 4
    mean = sum(loads.values()) / 4
    assert max(loads.values()) - mean <= max(size for _, _, size in first)


def _dense_step_traffic(placement_name: str) -> traffic.Traffic:
    """Traffic of one sync step of Dense(6->5), Dense(5->3), plain SGD, batch 8 as 2 micro-batches on 2 towers
    (CPU:0, CPU:1), host CPU:2."""
    towers, host = ("/device:CPU:0", "/device:CPU:1"), "/device:CPU:2"
    placement = devices.Placement(towers, towers[0], host, towers if placement_name == "spread" else ())

    def build_fn():
        return keras.Sequential([keras.Input((6,)), keras.layers.Dense(5), keras.layers.Dense(3)])

    with tf.device(placement.parameter_device):
        if placement.spread_over:
            model = spread.build_spread(build_fn, towers, reseed=lambda: keras.utils.set_random_seed(0))
        else:
            model = build_fn()
        optimizer = keras.optimizers.SGD(0.1)
        optimizer.build(model.trainable_variables)
        step = tf.Variable(0, dtype=tf.int64)
    micro_batch = tf.data.Dataset.from_tensors((tf.zeros((4, 6)), tf.zeros((4,), tf.int32))).repeat()
    streams = [PlacedIterator(micro_batch, host) for _ in range(2)]  # one input stream per micro-batch
    mode = SyncUpdate(CLASSIFY, model, optimizer, placement, 2, step, streams)
    graph = mode.step_graph()
    if placement.spread_over:  # what the hand count below assumes
        assert [v.value.device[-5:] for v in model.variables] == ["CPU:0", "CPU:1", "CPU:1", "CPU:1"]
    return traffic.count(graph, host)


def test_traffic_matches_a_hand_count():
    """Model: kernel 6x5 (120 B), bias 5 (20 B), kernel 5x3 (60 B), bias 3 (12 B): 212 B. Input: 8x6 float32
    (192 B) + 8 int32 labels (32 B), read on the host as two micro-batches of 112 B."""
    gpu = _dense_step_traffic("gpu")
    # CPU:0 holds everything: it sends tower 1 the 212 B of values and gets back tower 1's 212 B of gradients
    # plus its loss, weight, accuracy sum and accuracy count (4 B each).
    assert gpu.sent == {"CPU:2": 224, "CPU:0": 212, "CPU:1": 212 + 16}
    assert gpu.received == {"CPU:0": 112 + 212 + 16, "CPU:1": 112 + 212}
    assert gpu.unknown_edges == 0
    # Spread: CPU:0 owns the 6x5 kernel (120 B), CPU:1 the other three (92 B); greedy by bytes in order.
    # CPU:0 sends its kernel to tower 1 (120), tower 0's gradients of CPU:1's variables (92), and the learning
    # rate once for the three updates on CPU:1 (4: `fused_kernels` reads one copy per device). CPU:1 sends
    # its values to tower 0 (92), tower 1's kernel gradient (120), loss, weight, accuracy sum and count (16), and
    # its variables' squared norms for the global norm (3 x 4). The global weight the gradients are divided by
    # is summed on CPU:0 (the loss's device), beside tower 0's weight.
    spread_ = _dense_step_traffic("spread")
    assert spread_.sent == {"CPU:2": 224, "CPU:0": 120 + 92 + 4 + 4, "CPU:1": 92 + 120 + 16 + 12}
    assert spread_.received == {"CPU:0": 112 + 92 + 120 + 16 + 12, "CPU:1": 112 + 120 + 92 + 4 + 4}
    assert spread_.busiest() == ("CPU:0", 352)


def test_clipping_and_adamw_keep_the_bits(make_config, tmp_path):
    """Clipping mixes devices (one global norm over every variable) and adamw decays each variable where it
    lives: the weights stay those of one parameter device."""

    def run(placement):
        config = make_config(
            model_dir=tmp_path / placement,
            towers={"num_towers": 2, "parameter_device": placement},
            optimizer={"name": "adamw", "learning_rate": 0.01, "clip_global_norm": 0.5},
            loop={"train_steps": 4},
        )
        return train(config)["weights_sha256"]

    assert run("gpu") == run("spread")


def test_spread_keeps_the_busiest_device_near_the_ideal():
    """resnet20 at N = K = 3 (towers CPU:0-2, host CPU:3): one parameter device moves 2 x model bytes each way,
    1.5 x the ideal 2(N-1)/N; spread stays within the 1.25 x target."""
    from benchmarks.machines import traffic as bench

    rows = {p: bench.measure("resnet20", 3, p) for p in ("gpu", "spread")}
    ratio = {p: r["busiest_bytes"] / r["ideal_bytes"] for p, r in rows.items()}
    assert rows["spread"]["unknown_edges"] == 0
    assert 1.5 <= ratio["gpu"] < 1.55
    assert ratio["spread"] <= 1.25
