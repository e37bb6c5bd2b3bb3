"""The fixed summation tree (trainer.step.core.tree): its shape depends on K alone, and a task sends one partial sum
per maximal subtree it holds, read from the traced step with tasks stood in for by groups of logical devices."""

import keras
import pytest
import tensorflow as tf

from tasks.classify import Classify
from tests.support.cluster import grouped_placement
from trainer.loop.inputs import PlacedIterator
from trainer.settings.config import RunConfig
from trainer.step.core import spread, tree
from trainer.step.sync.sync_update import SyncUpdate
from trainer.step.transfers import traffic

CLASSIFY = Classify(RunConfig())  # (features, labels) batches, cross-entropy

pytestmark = pytest.mark.quick


@pytest.mark.parametrize(
    "k, shape",
    [
        (1, "0"),
        (2, "(0+1)"),
        (3, "((0+1)+2)"),
        (4, "((0+1)+(2+3))"),
        (5, "(((0+1)+(2+3))+4)"),
        (6, "(((0+1)+(2+3))+(4+5))"),
        (8, "(((0+1)+(2+3))+((4+5)+(6+7)))"),
    ],
)
def test_the_tree_depends_on_k_alone(k, shape):
    for num_tasks in [m for m in range(1, k + 1) if k % m == 0]:
        layout = tree.Layout(tuple(f"/device:CPU:{i}" for i in range(k)), ("h",) * num_tasks, k)
        seen = []

        def place(lo, hi, layout=layout, seen=seen):
            seen.append((lo, hi, layout.task_holding(lo, hi)))
            return None

        assert tree.reduce([str(j) for j in range(k)], lambda a, b: f"({a}+{b})", place) == shape
        # a sum inside one task's block runs on that task; only sums spanning tasks have none
        assert all(
            (task is None) == (len({layout.task_of_micro_batch(j) for j in range(lo, hi)}) > 1) for lo, hi, task in seen
        )


@pytest.mark.parametrize(
    "tasks, towers, sends",
    [
        (1, 4, [1]),
        (2, 2, [1, 1]),
        (4, 1, [1, 1, 1, 1]),
        (3, 1, [1, 1, 1]),
        (3, 2, [1, 1, 1]),
        (2, 3, [2, 2]),  # [0, 3) is (0+1) and 2; [3, 6) is 3 and (4+5)
        (3, 3, [2, 2, 2]),
        (2, 8, [1, 1]),
        (3, 4, [1, 1, 1]),
        (4, 4, [1, 1, 1, 1]),
    ],
)
def test_partial_sums_per_task(tasks, towers, sends):
    k = tasks * towers
    layout = tree.Layout(tuple(f"/device:CPU:{i}" for i in range(k)), tuple(f"h{t}" for t in range(tasks)), k)
    assert [layout.partial_sums(t) for t in range(tasks)] == sends
    assert [layout.block(t) for t in range(tasks)] == [(t * towers, (t + 1) * towers) for t in range(tasks)]


def test_twin_has_the_owners_place_on_its_task():
    towers = tuple(f"/job:worker/replica:0/task:{t}/device:GPU:{g}" for t in range(2) for g in range(4))
    hosts = tuple(f"/job:worker/replica:0/task:{t}/device:CPU:0" for t in range(2))
    layout = tree.Layout(towers, hosts, 8)
    assert layout.twin(towers[2], 1) == towers[6]
    assert layout.twin(towers[6], 0) == towers[2]
    assert layout.twin(hosts[0], 1) == hosts[1]
    assert layout.twin(towers[3], 0) == towers[3]
    assert layout.task_of_device("/job:worker/replica:0/task:1/device:GPU:3") == 1
    with pytest.raises(ValueError, match="none of the run's towers"):
        layout.task_of_device("/job:worker/replica:0/task:2/device:GPU:0")


# Dense(6->5) + Dense(5->3): kernels of 120 and 60 B, biases of 20 and 12 B.
MODEL_BYTES = 212


def _between_tasks(num_tasks: int, towers_per_task: int, placement_name: str, mirror: bool = False) -> traffic.Traffic:
    """Bytes crossing between tasks in one sync step, K = all towers, 2 examples per micro-batch. Task t's
    towers are logical devices CPU:t*T .. CPU:t*T+T-1 (some need not exist: the step is traced, not run) and
    its CPU is its first tower's device, as on a CPU machine. Variables live on task 0 or, spread, on towers."""
    n = num_tasks * towers_per_task
    towers, hosts, placement = grouped_placement(num_tasks, towers_per_task, placement_name)

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
    micro_batch = tf.data.Dataset.from_tensors((tf.zeros((2, 6)), tf.zeros((2,), tf.int32))).repeat()
    streams = [PlacedIterator(micro_batch, hosts[j]) for j in range(n)]  # read on its own task's CPU
    make_optimizer = (lambda: keras.optimizers.SGD(0.1)) if mirror else None
    mode = SyncUpdate(CLASSIFY, model, optimizer, placement, n, step, streams, make_optimizer=make_optimizer)
    graph = mode.step_graph()
    by_device = {traffic.short_device(d): f"task {i // towers_per_task}" for i, d in enumerate(towers)}
    return traffic.count(graph, towers[0], by_device.get, [it.device for it in streams])


@pytest.mark.parametrize("tasks, towers, losses", [(2, 2, 8), (2, 1, 0), (4, 1, 0)])
def test_a_remote_task_gets_the_values_once_and_sends_one_partial_sum(tasks, towers, losses):
    """Variables on task 0: each other task receives the 212 B of values once, however many towers read
    them, and sends back one partial gradient sum (212 B), its partial loss, weight, accuracy sum and accuracy
    count (4 B each) and
    each micro-batch's loss (4 B, for naming the micro-batch a divergence starts in; with one micro-batch per
    task that loss is the partial sum itself, sent once)."""
    counted = _between_tasks(tasks, towers, "cpu")
    for t in range(1, tasks):
        assert counted.received[f"task {t}"] == MODEL_BYTES
        assert counted.sent[f"task {t}"] == MODEL_BYTES + 16 + losses
    assert counted.sent["task 0"] == (tasks - 1) * MODEL_BYTES
    assert counted.unknown_edges == 0


def test_an_unaligned_block_sends_a_partial_sum_per_subtree():
    """2 tasks x 3 towers (K = 6): each task's block is two subtrees, so task 1 sends two partial sums (3 and
    4 + 5, each with its loss, weight and accuracy sums, 16 B; micro-batch 3's loss is its own partial sum, 4's
    and 5's go on their own, 8 B)."""
    counted = _between_tasks(2, 3, "cpu")
    assert counted.received["task 1"] == MODEL_BYTES
    assert counted.sent["task 1"] == 2 * (MODEL_BYTES + 16) + 8


def test_spread_over_tasks_moves_each_variable_once_each_way():
    """Spread over 2 x 2 towers (greedy by bytes): task 0 owns the 120 B kernel and the 20 B bias, task 1 the
    60 B kernel and the 12 B bias. Each task sends the other its own variables' values and one partial sum
    of the other's gradients: 72 + 140 and 140 + 72 B, which is 2(M-1)/M = 1 x the model's bytes, plus
    scalars (partial loss and count, learning rate, squared norms for the global norm)."""
    counted = _between_tasks(2, 2, "spread")
    for t in (0, 1):
        assert MODEL_BYTES <= counted.sent[f"task {t}"] <= MODEL_BYTES + 32
        assert MODEL_BYTES <= counted.received[f"task {t}"] <= MODEL_BYTES + 32


def test_a_power_of_two_towers_per_task_is_one_partial_sum_per_task():
    for towers in (1, 2, 4, 8):
        for tasks in range(1, 9):
            k = tasks * towers
            layout = tree.Layout(tuple(f"/device:CPU:{i}" for i in range(k)), ("h",) * tasks, k)
            assert {layout.partial_sums(t) for t in range(tasks)} == {1}, (tasks, towers)


@pytest.mark.parametrize("tasks, towers", [(2, 1), (2, 2), (3, 1), (4, 1)])
def test_mirrored_variables_move_the_ring_bound(tasks, towers):
    """Spread with the large kernels mirrored (`trainer.step.transfers.mirrors`: at M = 4 the 20 B bias too): every task
    moves 2(M-1)/M x the model's bytes each way, plus scalars (partial loss, weight and accuracy sums and counts,
    the global weight each task divides its mirrored gradients by, squared norms, the global step each replica's
    optimizer reads for its learning rate), at most 80 B here. Owned whole, the
    owner of the 120 B kernel moves (M-1) x 120 B each way: at M = 4, 1.46 x the bound (464 B)."""
    bound = 2 * (tasks - 1) / tasks * MODEL_BYTES
    counted = _between_tasks(tasks, towers, "spread", mirror=True)
    for t in range(tasks):
        assert bound <= counted.sent[f"task {t}"] <= bound + 80, (t, counted.sent, bound)
        assert bound <= counted.received[f"task {t}"] <= bound + 80, (t, counted.received, bound)
    if tasks == 4:
        whole = _between_tasks(tasks, towers, "spread")
        assert max(whole.sent.values()) >= 1.45 * bound
