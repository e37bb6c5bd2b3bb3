"""Tensor fusion across tasks (trainer.step.transfers.fused_buffers, --fuse_transfers): the same bits, fewer transfers.

Tasks are stood in for by groups of the 4 logical CPU devices (as in tests/trainer/step/test_tree.py) for the bits of
several placements and the transfer counts read off the traced step, and by processes talking gRPC on
127.0.0.1 (tests/support/cluster.py) for the bits of the real thing.
"""

import hashlib

import keras
import numpy as np
import pytest
import tensorflow as tf

import models
from tasks.classify import Classify
from tests.support.cluster import Job, grouped_placement, metrics, tf_config_envs
from trainer.loop.inputs import PlacedIterator
from trainer.settings.config import RunConfig
from trainer.step.core import spread, tree
from trainer.step.sync.sync_update import SyncUpdate
from trainer.step.transfers import fused_buffers, traffic
from trainer.system import determinism

CLASSIFY = Classify(RunConfig())  # (features, labels) batches, cross-entropy


def _digest(values) -> str:
    return hashlib.sha256(b"".join(np.asarray(v).tobytes() for v in values)).hexdigest()


def _build(num_tasks: int, towers_per_task: int, placement_name: str, k: int, fuse: bool) -> SyncUpdate:
    """A SyncUpdate of the cnn (conv kernels, BatchNorm statistics: float32; Dropout seed states: integers) on
    8x8x1 inputs over `num_tasks` groups of logical devices, K = `k` micro-batches of 2 examples, momentum;
    under spread on several tasks its large kernels are mirrored (`trainer.step.transfers.mirrors`)."""
    n = num_tasks * towers_per_task
    towers, hosts, placement = grouped_placement(num_tasks, towers_per_task, placement_name)
    determinism.configure(0, True)  # as every run's build does

    def build_fn():
        return models.build_model("cnn", (8, 8, 1), 10)

    with tf.device(placement.parameter_device):
        reseed = lambda: keras.utils.set_random_seed(0)  # noqa: E731
        reseed()
        model = spread.build_spread(build_fn, towers, reseed) if placement.spread_over else build_fn()
        step = tf.Variable(0, dtype=tf.int64)
        make_optimizer = lambda: keras.optimizers.SGD(0.05, momentum=0.9)  # noqa: E731
        optimizer = make_optimizer()
        optimizer.build(model.trainable_variables)
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(2 * k, 8, 8, 1)).astype(np.float32), rng.integers(0, 10, 2 * k).astype(np.int32)
    streams = []
    for j in range(k):
        micro_batches = tf.data.Dataset.from_tensors((x[2 * j : 2 * j + 2], y[2 * j : 2 * j + 2])).repeat()
        streams.append(PlacedIterator(micro_batches, hosts[j * n // k]))
    mirror = make_optimizer if placement_name == "spread" else None
    return SyncUpdate(
        CLASSIFY, model, optimizer, placement, k, step, streams, make_optimizer=mirror, fuse_transfers=fuse
    )


@pytest.mark.parametrize(
    "tasks, towers, placement, k",
    [(2, 2, "cpu", 4), (2, 1, "gpu", 2), (2, 2, "gpu", 6), (2, 2, "spread", 4), (4, 1, "spread", 4), (4, 1, "cpu", 4)],
)
def test_fused_transfers_train_the_same_weights(tasks, towers, placement, k):
    """Fused and unfused: the same weights (every variable: kernels, BatchNorm statistics, seed states) after 3
    steps. K = 6 on 2 x 2: each task's block is two subtrees, one a single micro-batch sent from its tower."""
    hashes = {}
    for fuse in (False, True):
        mode = _build(tasks, towers, placement, k, fuse)
        assert np.isfinite(mode.train_steps(3).loss)
        hashes[fuse] = _digest([v.numpy() for v in mode.model.variables])
        if placement == "spread":
            assert mode.mirrors.indices  # the mirrored all-reduce runs beside the fused sends
    assert hashes[True] == hashes[False]


def _between_tasks(tasks: int, towers: int, placement: str, k: int, fuse: bool) -> traffic.Traffic:
    mode = _build(tasks, towers, placement, k, fuse)
    all_towers = grouped_placement(tasks, towers, placement)[0]
    by_device = {traffic.short_device(d): f"task {i // towers}" for i, d in enumerate(all_towers)}
    return traffic.count(mode.step_graph(), all_towers[0], by_device.get, [it.device for it in mode.iterators])


@pytest.mark.quick
@pytest.mark.parametrize(
    "tasks, towers, placement, k, unfused, fused, twice",
    [
        # Task 1 receives the cnn's 10 trainable and 4 BatchNorm values (float32) and 2 Dropout seed states
        # (int64): 16 tensors, fused 2; and the global step once per tower (for the seeds; not fused). It
        # sends 10 partial gradient sums, its partial weight, loss, accuracy sum and count, and per BatchNorm
        # statistic a partial sum and an "unchanged" flag (4 + 4): 22 tensors, fused 2 (float32, bool); and
        # with 2 micro-batches each one's loss (read to name one that diverged; not fused).
        (2, 2, "cpu", 4, (18, 24), (4, 4), 0),
        # One micro-batch: unfused, its loss is its partial loss sum, sent once; fused, 4 B twice.
        (2, 1, "cpu", 2, (17, 22), (3, 3), 4),
        # Two subtrees, [3, 4) (a single micro-batch, as above) and [4, 6): two of each partial sum unfused.
        (2, 2, "gpu", 6, (18, 46), (4, 5), 4),
    ],
)
def test_fusion_sends_one_buffer_per_device_pair_and_dtype(tasks, towers, placement, k, unfused, fused, twice):
    """Transfers into and out of task 1 (variables on task 0), read off the traced step: unfused one per
    tensor, fused one per (device, device, dtype) for what fusion covers. The same bytes, but for the loss of
    a micro-batch that is a subtree of its own (`twice`: in the buffer, and alone to be read)."""
    counted = {fuse: _between_tasks(tasks, towers, placement, k, fuse) for fuse in (False, True)}
    for fuse, want in [(False, unfused), (True, fused)]:
        got = counted[fuse].tensors_received["task 1"], counted[fuse].tensors_sent["task 1"]
        assert got == want, (fuse, got)
        assert counted[fuse].unknown_edges == 0
    assert counted[True].sent == {**counted[False].sent, "task 1": counted[False].sent["task 1"] + twice}
    assert counted[True].received == {**counted[False].received, "task 0": counted[False].received["task 0"] + twice}


LAYOUT = ("--micro_batches=4", "--global_batch_size=64", "--train_steps=6", "--checkpoint_every_steps=0")


@pytest.mark.parametrize("placement", ["cpu", "spread"])
def test_two_tasks_over_grpc_train_the_same_weights_fused(tmp_path, placement):
    """2 tasks x 2 towers as processes on 127.0.0.1 (the cnn on the digits, --deterministic): weights_sha256 is
    the same with --fuse_transfers on and off (spread: the cnn's dense kernel mirrored, the rest fused)."""
    hashes = {}
    for fuse in ("false", "true"):
        model_dir = tmp_path / f"fuse-{fuse}"
        flags = (*LAYOUT, f"--parameter_device={placement}", f"--fuse_transfers={fuse}")
        job = Job(model_dir, tf_config_envs(2), 2, *flags)
        assert job.wait() == [0, 0], job.output(0)[-3000:]
        result = metrics(model_dir)
        assert result["global_step"] == 6 and result["num_tasks"] == 2
        hashes[fuse] = result["weights_sha256"]
    assert hashes["true"] == hashes["false"], hashes


@pytest.mark.quick
def test_a_shape_known_only_at_run_time_is_sent_on_its_own():
    """A leaf whose shape is known only at run time (the language model has some) cannot be cut out of a buffer
    by static sizes: it crosses on its own, the static ones fused; the sums are those of the unfused layout."""
    towers = ("/device:CPU:0", "/device:CPU:1")  # 2 tasks of one tower each, the CPU the tower's device
    a, b = np.arange(5, dtype=np.float32), np.arange(3, dtype=np.float32) / 7
    sums = {}
    for layout in (tree.Layout(towers, towers, 2), fused_buffers.FusedLayout(towers, towers, 2)):

        @tf.function(input_signature=[tf.TensorSpec([None]), tf.TensorSpec([3])])
        def step(dynamic, static, layout=layout):
            leaves = []
            for j, tower in enumerate(towers):
                with tf.device(tower):
                    leaves.append((dynamic * (j + 1), static * (j + 1)))
            return layout.tree_sums([[leaf[0] for leaf in leaves], [leaf[1] for leaf in leaves]], [towers[0]] * 2)

        sums[type(layout).__name__] = [np.asarray(t) for t in tf.nest.flatten(step(a, b))]
    for got, want in zip(sums["FusedLayout"], sums["Layout"], strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(sums["FusedLayout"][0], a * 3)
