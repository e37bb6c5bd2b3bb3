"""Tensor fusion across tasks: what one task sends one device of another at one point of a step, as one buffer.

Across tasks a sync step moves two sets of tensors (`trainer.step.core.tree`): the values of the variables a task
does not own (one copy per task, `Layout.fanout`), and the partial sums of the subtrees a task holds (the
gradients, the loss, weight and metric sums, the non-trainable state: `Layout.tree_sums`), to their owners.
Unfused, each is its own gRPC transfer, and each transfer has a fixed cost on top of its bytes
(benchmarks/results/machines.md: ~0.54 ms of a 2x1 cnn step is fixed, much of it in the number of tensors).
Fused (Horovod's tensor fusion), the tensors going from one device to one device of another task are
flattened and concatenated on the sender, sent as one tensor, and split and reshaped on the receiver: one
transfer per (source device, destination device, dtype).

Concat, split and reshape copy bits, and every add of the tree is the same add on the same device as
unfused, so the weights are bitwise those of the unfused step (tests/trainer/step/test_fusion.py). What it costs:
the buffer leaves when its last tensor exists, where unfused each gradient's partial sum leaves as soon as
it is summed (overlap with the rest of the backward pass), and a copy on each side. Left unfused: the
mirrored variables' all-reduce (`Layout.all_reduce`), the per-micro-batch losses (read to name a
micro-batch whose loss is not finite) and tensors whose shape is not static (a buffer is cut by static sizes).

`FusedLayout` is `tree.Layout` with `fanout` and `tree_sums` fused; `trainer.step.sync.sync_update` picks one of the
two from `--fuse_transfers`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import tensorflow as tf

from trainer.step.core import spread, tree


def send_fused(tensors: Sequence, source: str, destination: str) -> list:
    """`tensors` (one dtype, on `source`) as one flat buffer concatenated on `source`, split and reshaped
    on `destination`: the same values, there, in one transfer."""
    with tf.device(source):
        flat = tf.concat([tf.reshape(t, [-1]) for t in tensors], 0)
    return receive_fused(flat, tensors, destination)


def receive_fused(flat, tensors: Sequence, destination: str) -> list:
    """`flat` (a `send_fused` buffer of `tensors`) cut back into tensors shaped as `tensors`, on `destination`."""
    sizes = [t.shape.num_elements() for t in tensors]
    with tf.device(destination):
        pieces = tf.split(flat, sizes) if len(tensors) > 1 else [flat]
        return [tf.reshape(p, t.shape) for p, t in zip(pieces, tensors, strict=True)]


@dataclasses.dataclass(frozen=True)
class FusedLayout(tree.Layout):
    """A `tree.Layout` whose transfers between tasks are fused (see the module's docstring)."""

    def fanout(self, values: Sequence, owners: Sequence[str], local: dict | None = None) -> list[list]:
        """As `tree.Layout.fanout`; the values one device sends a task's twin go as one buffer per dtype,
        concatenated once per (device, dtype, values) however many tasks receive it."""
        if self.num_tasks == 1:
            return [list(values)]
        local = local or {}
        buffers = {}  # (owner, dtype, indices) -> the buffer, built once and sent to every task that reads it
        out = []
        for task in range(self.num_tasks):
            copies = list(values)  # values owned on this task stay as they are
            groups: dict[tuple, tuple[str, str, list[int]]] = {}  # by full device names: one per device
            for i, owner in enumerate(owners):
                if (task, i) in local:
                    copies[i] = local[(task, i)]
                elif not values[i].shape.is_fully_defined() and self.task_of_device(owner) != task:
                    with tf.device(self.twin(owner, task)):  # a shape known only at run time: sent on its own
                        copies[i] = tf.identity(values[i])
                elif self.task_of_device(owner) != task:
                    twin = self.twin(owner, task)
                    key = (spread.full_name(owner), spread.full_name(twin), values[i].dtype)
                    groups.setdefault(key, (owner, twin, []))[2].append(i)
            for (owner_name, _, dtype), (owner, twin, indices) in groups.items():
                tensors = [values[i] for i in indices]
                key = (owner_name, dtype, tuple(indices))
                if key not in buffers:
                    with tf.device(owner):
                        buffers[key] = tf.concat([tf.reshape(t, [-1]) for t in tensors], 0)
                for i, copy in zip(indices, receive_fused(buffers[key], tensors, twin), strict=True):
                    copies[i] = copy
            out.append(copies)
        return out

    def tree_sums(self, leaf_lists: Sequence[Sequence], owners: Sequence[str], combine: Callable = tree.add) -> list:
        """As `tree.Layout.tree_sums`; the partial results one task sends one owner device go as one buffer per
        dtype: each remote subtree is combined on its task first (the same ops on the same devices as
        unfused), the results cross fused, and the tree above them runs on the owners. A leaf may be a tuple
        of tensors (`combine` takes and returns such tuples); each of its tensors goes in its dtype's buffer."""
        if self.num_tasks == 1:
            return super().tree_sums(leaf_lists, owners, combine)
        crossing: dict[tuple, tuple] = {}  # (source, owner, dtype) -> (source, owner, [(q, lo, hi, index, tensor)])
        partials = {}  # (q, lo, hi) -> the partial result, whose structure the received tensors are packed as
        for q, (leaves, owner) in enumerate(zip(leaf_lists, owners, strict=True)):
            place, owner_task = self.placer(owner), self.task_of_device(owner)
            if not all(t.shape.is_fully_defined() for t in tf.nest.flatten(list(leaves))):
                continue  # a shape known only at run time: its partial sums are sent on their own, as unfused
            for task in range(self.num_tasks):
                if task == owner_task:
                    continue
                for lo, hi in tree.subtrees_within(*self.block(task), self.num_micro_batches):
                    partials[(q, lo, hi)] = partial = _node(leaves, lo, hi, place, combine, {})
                    source = self._tower_of(lo) if hi - lo == 1 else place(lo, hi)
                    for index, tensor in enumerate(tf.nest.flatten(partial)):
                        key = (spread.full_name(source), spread.full_name(owner), tensor.dtype)
                        crossing.setdefault(key, (source, owner, []))[2].append((q, lo, hi, index, tensor))
        received = {}  # (q, lo, hi) -> {index: the tensor on the owner}
        for source, owner, parts in crossing.values():
            copies = send_fused([p[4] for p in parts], source, owner)
            for (q, lo, hi, index, _), copy in zip(parts, copies, strict=True):
                received.setdefault((q, lo, hi), {})[index] = copy
        known: list[dict] = [{} for _ in leaf_lists]
        for (q, lo, hi), tensors in received.items():
            flat = [tensors[i] for i in range(len(tensors))]
            known[q][(lo, hi)] = tf.nest.pack_sequence_as(partials[(q, lo, hi)], flat)
        return [
            _node(leaves, 0, len(leaves), self.placer(owner), combine, done)
            for leaves, owner, done in zip(leaf_lists, owners, known, strict=True)
        ]

    def _tower_of(self, micro_batch: int) -> str:
        """The tower micro-batch `micro_batch` runs on (`trainer.system.devices.tower_of_micro_batch`)."""
        return self.towers[micro_batch * len(self.towers) // self.num_micro_batches]


def _node(leaves: Sequence, lo: int, hi: int, place: Callable, combine: Callable, known: dict):
    """`leaves[lo:hi]` combined as `tree.reduce` combines them, taking the results in `known` as given."""
    if (lo, hi) in known:
        return known[(lo, hi)]
    if hi - lo == 1:
        return leaves[lo]
    mid = lo + tree.left_size(hi - lo)
    left, right = _node(leaves, lo, mid, place, combine, known), _node(leaves, mid, hi, place, combine, known)
    with tf.device(place(lo, hi)):
        return combine(left, right)
