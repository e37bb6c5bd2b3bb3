"""The fixed-order reduction of a step's K micro-batch results, and the one division by the global weight.

`combine` sums each micro-batch's loss, weight, metric sums, gradients and new non-trainable values along the
fixed tree (`trainer.step.core.tree`), each on its owner (or a task's twin of it), and divides the loss and the
gradients once by the global weight; mirrored variables' gradients are all-reduced instead
(`trainer.step.transfers.mirrors`). The result does not depend on which tower, task or pipeline ran a micro-batch.
"""

from __future__ import annotations

import tensorflow as tf

from trainer.step.core import tree
from trainer.step.core.micro_batch import MicroBatchResult, per_weight


def combine(results: list[MicroBatchResult], seed_flags: list[bool], old_state, owners, mirrors):
    """Reduces per-micro-batch results along the fixed tree (`trainer.step.core.tree`), and divides once.

    The loss, weight and metric sums and each variable's gradient are summed along the tree; each gradient
    (and the loss) is then divided by the global weight, on the variable's owner: the mean over every weighted
    example (token) of the global batch, the same for any number of towers and tasks at fixed K. A gradient is
    summed on its owner, or, for a subtree one task holds, on that task's twin of the owner, so only one
    partial sum per subtree crosses between tasks. A mirrored variable's gradient is all-reduced instead, a
    copy on every task (`trainer.step.transfers.mirrors`).

    Args:
      old_state: per task, the non-trainable values its micro-batches started from (`Layout.fanout`).
      owners: (devices of the trainable variables, devices of the non-trainable variables, the device of
        the loss and metric sums).
      mirrors: the run's `trainer.step.transfers.mirrors.Mirrors` (its `layout`: which task holds each micro-batch).

    Returns:
      (loss per weight, {name: (sum, count)} of the task's metrics, gradients per weight, new non-trainable
      values or None for seed states, and per task {index: gradient per weight} of the mirrored variables'
      replicas there).
    """
    layout = mirrors.layout
    floating, state_lists = _state_leaves(results, seed_flags, old_state, owners[1], layout)
    weight, loss_sum, metrics, totals, states = _tree_sums(results, owners, mirrors, floating, state_lists)
    with tf.device(owners[2]):
        loss = per_weight(loss_sum, weight)
    grads, replica_grads = [], {task: {} for task in range(layout.num_tasks)}
    for i, device in enumerate(owners[0]):
        if i in totals:
            with tf.device(device):
                grads.append(per_weight(totals[i], weight))
            continue
        means = _all_reduced_means(mirrors, i, [r.grads[i] for r in results], device, weight)
        grads.append(means.pop(layout.task_of_device(device)))
        for task, mean in means.items():
            replica_grads[task][i] = mean
    new_state = _new_states(results, seed_flags, old_state, owners[1], layout, dict(zip(floating, states, strict=True)))
    return loss, metrics, grads, new_state, replica_grads


def _tree_sums(results: list[MicroBatchResult], owners, mirrors, floating: list[int], state_lists: list) -> tuple:
    """The tree sums of the weights, losses and metric sums and counts (placed for `owners[2]`), of the
    gradients of the variables owned whole (for their owners) and of the state leaves of the `floating`
    non-trainable variables (`_state_leaves`, for theirs), as one `Layout.tree_sums`: under
    `--fuse_transfers` what crosses between tasks goes fused (`fused_buffers`). Returns (weight, loss,
    metrics, {index: gradient}, [(sum, unchanged)] of the state)."""
    names = list(results[0].metrics)
    whole = [i for i in range(len(owners[0])) if i not in mirrors.homes]
    leaf_lists = [[r.weight for r in results], [r.loss for r in results]]
    leaf_lists += [[r.metrics[name][part] for r in results] for name in names for part in (0, 1)]
    leaf_lists += [[r.grads[i] for r in results] for i in whole]
    devices = [owners[2]] * (2 + 2 * len(names)) + [owners[0][i] for i in whole] + [owners[1][i] for i in floating]
    sums = mirrors.layout.tree_sums(leaf_lists + state_lists, devices, _sum_or_all)
    metrics = {name: (sums[2 + 2 * n], sums[3 + 2 * n]) for n, name in enumerate(names)}
    grads = sums[2 + 2 * len(names) : len(leaf_lists)]
    return sums[0], sums[1], metrics, dict(zip(whole, grads, strict=True)), sums[len(leaf_lists) :]


def _sum_or_all(a, b):
    """Two leaves (tensors, or tuples of them) combined along the tree: summed, booleans AND-ed."""
    return tf.nest.map_structure(lambda x, y: tf.logical_and(x, y) if x.dtype == tf.bool else x + y, a, b)


def _all_reduced_means(mirrors, index: int, leaves: list, home: str, weight: tf.Tensor) -> dict:
    """Per task, mirrored variable `index`'s gradients `leaves` summed and divided by the global `weight`, on
    the task's twin of `home`."""
    means = {}
    for task, total in mirrors.all_reduce(index, leaves).items():
        with tf.device(mirrors.layout.twin(home, task)):
            means[task] = per_weight(total, weight)
    return means


def _state_leaves(results: list[MicroBatchResult], seed_flags, old_state, owners, layout: tree.Layout) -> tuple:
    """The floating non-trainable variables (not seed states) and, per variable, its K leaves (micro-batch
    value, whether it equals the old value) to combine along the tree; `old_state[t]` is task t's copy of the
    values the micro-batches started from, `owners` the variables' devices."""
    # BatchNorm: mean of the K updates from the same old value == one update with the mean micro-batch
    # statistic; the same for every tower count. Where no micro-batch changed a value (frozen BatchNorm,
    # Normalization), (K * x) / K can differ from x by an ulp unless K is a power of two: keep x itself
    # there, so untouched state never drifts. "Unchanged" is an AND, combined along the same tree.
    floating = [i for i, flag in enumerate(seed_flags) if not flag and results[0].non_trainable[i].dtype.is_floating]
    leaf_lists = []
    for i in floating:
        place, leaves = layout.placer(owners[i]), []
        for j, result in enumerate(results):
            value = result.non_trainable[i]
            with tf.device(place(j, j + 1)):
                leaves.append((value, tf.equal(value, old_state[layout.task_of_micro_batch(j)][i])))
        leaf_lists.append(leaves)
    return floating, leaf_lists


def _new_states(results, seed_flags, old_state, owners, layout: tree.Layout, combined: dict) -> list:
    """Each non-trainable variable's new value: None for a seed state, the last micro-batch's for an integer,
    else the mean of the micro-batches' values, or the old value where none changed it (`combined`: index ->
    (sum, unchanged) along the tree)."""
    new_state = [None if flag else results[-1].non_trainable[i] for i, flag in enumerate(seed_flags)]
    for i, (total, unchanged) in combined.items():
        with tf.device(owners[i]):
            old = old_state[layout.task_of_device(owners[i])][i]
            new_state[i] = tf.where(unchanged, old, _mean(total, len(results)))
    return new_state


def _mean(total: tf.Tensor, count: int) -> tf.Tensor:
    """`total / count`; for one micro-batch `total` itself, which is the same bits (x / 1 == x exactly) without
    the divide op on every variable of every step."""
    return total if count == 1 else total / tf.cast(count, total.dtype)
