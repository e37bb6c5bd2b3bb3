"""Mirrored variables (trainer.step.transfers.mirrors): large variables kept on every task, their gradients all-reduced.

Tasks are stood in for by groups of the 4 logical CPU devices, as in tests/trainer/step/test_tree.py: the same code as
on several machines, in one process. The weights must be bitwise those of one task, every replica bitwise its
home variable, and a replica set from a restored state must continue as the uninterrupted run.
"""

import hashlib

import keras
import numpy as np
import pytest
import tensorflow as tf

from tasks.classify import Classify
from tests.support.cluster import grouped_placement
from trainer.loop.inputs import PlacedIterator
from trainer.settings.config import RunConfig
from trainer.step.core import spread
from trainer.step.sync.sync_update import SyncUpdate
from trainer.step.transfers import mirrors
from trainer.system import determinism

CLASSIFY = Classify(RunConfig())  # (features, labels) batches, cross-entropy

K = 4


def _digest(values) -> str:
    return hashlib.sha256(b"".join(np.asarray(v).tobytes() for v in values)).hexdigest()


def _build(num_tasks: int, towers_per_task: int, placement_name: str, optimizer_name: str, clip=0.0, skip=0):
    """A SyncUpdate over `num_tasks` groups of logical devices: Dense 16->64->8->3 (the first two kernels are
    mirrored on 2 and more tasks under spread), K = 4 micro-batches of 4 examples, each stream from its
    `skip`-th micro-batch on."""
    n = num_tasks * towers_per_task
    towers, hosts, placement = grouped_placement(num_tasks, towers_per_task, placement_name)

    def build_fn():
        layers = [keras.layers.Dense(64), keras.layers.Dense(8), keras.layers.Dense(3)]
        return keras.Sequential([keras.Input((16,)), *layers])

    determinism.configure(0, True)  # as every run's build does: no rewrite of the sums by grappler
    with tf.device(placement.parameter_device):
        reseed = lambda: keras.utils.set_random_seed(0)  # noqa: E731
        model = spread.build_spread(build_fn, towers, reseed) if placement.spread_over else build_fn()
        step = tf.Variable(0, dtype=tf.int64)

        def make_optimizer():
            rate = lambda: 0.1 * tf.cast(step + 1, tf.float32) ** -0.5  # noqa: E731 (a schedule of the step)
            return (
                keras.optimizers.SGD(rate, momentum=0.9)
                if optimizer_name == "momentum"
                else keras.optimizers.Adam(rate)
            )

        optimizer = make_optimizer()
        optimizer.build(model.trainable_variables)
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(64, 16)).astype(np.float32), rng.integers(0, 3, 64).astype(np.int32)
    streams = []
    for j in range(K):
        micro_batches = tf.data.Dataset.from_tensor_slices((x[j::K], y[j::K])).batch(4, drop_remainder=True)
        streams.append(PlacedIterator(micro_batches.repeat().skip(skip), hosts[j * n // K]))
    return SyncUpdate(
        CLASSIFY, model, optimizer, placement, K, step, streams, clip_global_norm=clip, make_optimizer=make_optimizer
    )


def _replicas_match(mode) -> None:
    for task, replicas in mode.mirrors.replicas.items():
        for i, replica in replicas.items():
            home = mode.model.trainable_variables[i]
            assert _digest([replica.numpy()]) == _digest([home.numpy()]), (task, home.path)
            assert mode.mirrors.layout.task_of_device(replica.value.device) == task


# Not in the quick subset: each trains 4 layouts (5-11 s alone, 25-106 s beside another TensorFlow process on 2
# cores); the full suite runs them.
@pytest.mark.parametrize("optimizer_name, clip", [("momentum", 0.0), ("adam", 0.05)])
def test_mirrored_layouts_train_the_weights_of_one_task(optimizer_name, clip):
    """Adam (a slot per moment, bias correction from the iteration count) with clipping (the norm of the home's
    gradient, the same factor for every replica) and momentum: one set of weights on 1 x 4, 2 x 2 and 4 x 1."""
    hashes = {}
    for layout in [(1, 4, "gpu"), (2, 2, "spread"), (4, 1, "spread"), (2, 2, "cpu")]:
        mode = _build(*layout, optimizer_name, clip)
        result = mode.train_steps(5)
        assert np.isfinite(result.loss)
        hashes[layout] = _digest([v.numpy() for v in mode.model.variables])
        _replicas_match(mode)
        if layout[2] == "spread":
            assert mode.mirrors.indices == [0, 2]  # the kernels of 4 KB and 2 KB; the biases stay whole
            assert sum(len(r) for r in mode.mirrors.replicas.values()) == 2 * (layout[0] - 1)
        else:
            assert mode.mirrors.indices == []
    assert len(set(hashes.values())) == 1, hashes


def test_replicas_are_set_from_a_restored_state_and_continue_as_the_uninterrupted_run():
    """6 steps on 1 x 4 against 3 steps on 2 x 2, that state carried (as a checkpoint does: the model and the
    run's optimizer, not the replicas) to a fresh 4 x 1, then 3 more: the same weights, the replicas and
    their optimizers' slots and iteration counts set from the run's."""
    straight = _build(1, 4, "gpu", "adam")
    straight.train_steps(6)
    first = _build(2, 2, "spread", "adam")
    first.train_steps(3)
    resumed = _build(4, 1, "spread", "adam", skip=3)
    for source, target in [
        (first.model.variables, resumed.model.variables),
        (first.optimizer.variables, resumed.optimizer.variables),
    ]:
        for a, b in zip(source, target, strict=True):
            b.assign(a.numpy())
    resumed.global_step.assign(first.global_step.numpy())
    resumed.train_steps(3)
    assert _digest([v.numpy() for v in resumed.model.variables]) == _digest(
        [v.numpy() for v in straight.model.variables]
    )
    _replicas_match(resumed)
    main = {v.path.split("/", 1)[1]: v.numpy() for v in resumed.optimizer.variables}
    for task, optimizer in resumed.mirrors.optimizers.items():
        assert int(optimizer.iterations.numpy()) == int(resumed.optimizer.iterations.numpy()) == 6
        for slot in optimizer.variables[2:]:
            name = slot.path.split("/", 1)[1].replace(f"_task{task}", "")
            assert _digest([slot.numpy()]) == _digest([main[name]]), name


@pytest.mark.quick
def test_which_variables_are_mirrored():
    """At least 1/(4M) of the model's bytes, on several tasks under spread, never under fp16's loss scaling."""
    sizes = [keras.Variable(tf.zeros([n])) for n in (700, 200, 65, 35)]  # bytes: 2800, 800, 260, 140 of 4000
    assert mirrors.choose(sizes, 2, ("a", "b"), False) == [0, 1]  # >= 500 B
    assert mirrors.choose(sizes, 4, ("a", "b"), False) == [0, 1, 2]  # >= 250 B
    assert mirrors.choose(sizes, 1, ("a", "b"), False) == []  # one task: nothing to mirror
    assert mirrors.choose(sizes, 2, (), False) == []  # variables on one device: owned whole
    assert mirrors.choose(sizes, 2, ("a", "b"), True) == []  # fp16: a loss-scale optimizer
