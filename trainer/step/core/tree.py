"""The fixed summation tree over micro-batch indices, and where each of its sums runs.

Floating-point addition is not associative, so the order of a sum is part of its result. The K micro-batch
results of a step are summed as one binary tree whose shape depends on K alone: the range [lo, hi) splits
into a left part whose size is the largest power of two below hi - lo, and the rest. For K = 4 that is
(0 + 1) + (2 + 3); for K = 6, ((0 + 1) + (2 + 3)) + (4 + 5); for K = 3, (0 + 1) + 2. Every layout adds the same
pairs in the same order, so the bits cannot depend on which task or tower holds which micro-batch.

Micro-batches go to towers in contiguous blocks (`trainer.system.devices.tower_of_micro_batch`), so a task
holds whole subtrees. Each sum runs where its operands already are when it can:

- a subtree inside one task is summed on that task, on the task's twin of the variable's owner (the device
  with the owner's place on that task: the same tower index, or the task's CPU for a variable on the CPU),
  and sent to the owner as one partial sum;
- a sum whose range spans tasks runs on the owner.

So a task other than the owner's sends one tensor per maximal subtree it holds: one when its block is a
subtree (K/M a power of two, or M = 1), a few otherwise (`partial_sums`). The same twin gives every task one
copy of each variable's value per step, from which its towers read (`Fanout`). On one machine every range
is inside the one task and every sum runs on the owner, as before the tree existed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import tensorflow as tf

from trainer.step.core import spread

# Recorded in run.json: a resume may not silently mix summation orders (`trainer.outputs.rundir`).
ORDER = "tree"


def left_size(n: int) -> int:
    """The size of the left part of a range of n >= 2 leaves: the largest power of two below n."""
    return 1 << ((n - 1).bit_length() - 1)


def subtrees_within(lo: int, hi: int, k: int) -> list[tuple[int, int]]:
    """The maximal subtrees of the K-leaf tree that lie inside [lo, hi), left to right."""
    out = []

    def visit(a: int, b: int) -> None:
        if b <= lo or a >= hi:
            return
        if lo <= a and b <= hi:
            out.append((a, b))
            return
        mid = a + left_size(b - a)
        visit(a, mid)
        visit(mid, b)

    visit(0, k)
    return out


def reduce(leaves: Sequence, combine: Callable, place: Callable[[int, int], str]):
    """Combines `leaves` along the tree; the combination of range [lo, hi) runs under `tf.device(place(lo, hi))`."""

    def node(lo: int, hi: int):
        if hi - lo == 1:
            return leaves[lo]
        mid = lo + left_size(hi - lo)
        left, right = node(lo, mid), node(mid, hi)
        with tf.device(place(lo, hi)):
            return combine(left, right)

    return node(0, len(leaves))


def add(a, b):
    return a + b


def tree_sum(tensors: Sequence, place: Callable[[int, int], str] | None = None):
    """The tree sum of `tensors`, each add under `place(lo, hi)` (None: the ambient device)."""
    return reduce(tensors, add, place or (lambda lo, hi: None))


@dataclasses.dataclass(frozen=True)
class Layout:
    """Which task holds each micro-batch, and each task's twin of a device.

    Tasks are groups of devices: task t's towers are towers[t*T : (t+1)*T] and its CPU is hosts[t]. On one
    machine there is one group. Tests stand tasks in for with groups of local logical devices, so the rule
    is the same code whether a "task" is a machine or not.
    """

    towers: tuple[str, ...]
    hosts: tuple[str, ...]  # one per task
    num_micro_batches: int
    devices: tuple[str, ...] = ()  # every device of the towers, task-major (--tensor_parallel: T a tower); (): towers

    @classmethod
    def of(cls, placement, num_micro_batches: int) -> Layout:
        """The layout of a run's `trainer.system.devices.Placement`."""
        per_task = len(placement.towers) // placement.num_tasks
        hosts = tuple(placement.host_of(t * per_task) for t in range(placement.num_tasks))
        devices = tuple(device for tower in range(len(placement.towers)) for device in placement.group(tower))
        return cls(placement.towers, hosts, num_micro_batches, devices)

    @property
    def _devices(self) -> tuple[str, ...]:
        return self.devices or self.towers

    @property
    def num_tasks(self) -> int:
        return len(self.hosts)

    def task_of_micro_batch(self, j: int) -> int:
        return j * self.num_tasks // self.num_micro_batches  # = tower_of_micro_batch(j) // towers per task

    def task_holding(self, lo: int, hi: int) -> int | None:
        """The task holding every micro-batch of [lo, hi), None when it spans tasks."""
        first, last = self.task_of_micro_batch(lo), self.task_of_micro_batch(hi - 1)
        return first if first == last else None

    def block(self, task: int) -> tuple[int, int]:
        k, m = self.num_micro_batches, self.num_tasks
        return task * k // m, (task + 1) * k // m

    def partial_sums(self, task: int) -> int:
        """How many partial sums `task` sends for a variable owned on another task."""
        return len(subtrees_within(*self.block(task), self.num_micro_batches))

    def task_of_device(self, device: str) -> int:
        if self.num_tasks == 1:
            return 0
        spec, per_task = spread.full_name(device), len(self._devices) // self.num_tasks
        for task in range(self.num_tasks):
            group = (*self._devices[task * per_task : (task + 1) * per_task], self.hosts[task])
            if any(spread.full_name(d) == spec for d in group):
                return task
        raise ValueError(f"{device} is none of the run's towers or task CPUs")

    def twin(self, device: str, task: int) -> str:
        """The device of `task` with `device`'s place on its own task (same tower index, or the CPU)."""
        owner_task, per_task = self.task_of_device(device), len(self._devices) // self.num_tasks
        if owner_task == task:
            return device
        spec = spread.full_name(device)
        for i in range(per_task):
            if spread.full_name(self._devices[owner_task * per_task + i]) == spec:
                return self._devices[task * per_task + i]
        return self.hosts[task]

    def fanout(self, values: Sequence, owners: Sequence[str], local: dict | None = None) -> list[list]:
        """Per task, the values its towers read: the value itself on its owner's task, `local[(task, i)]` where
        the task has its own copy of value i (`trainer.step.transfers.mirrors`), elsewhere one copy on the task's twin
        of the owner (one transfer per task, which the task's towers then share)."""
        if self.num_tasks == 1:
            return [list(values)]
        local = local or {}
        out = []
        for task in range(self.num_tasks):
            copies = []
            for i, (value, owner) in enumerate(zip(values, owners, strict=True)):
                if self.task_of_device(owner) == task:
                    copies.append(value)
                elif (task, i) in local:
                    copies.append(local[(task, i)])
                else:
                    with tf.device(self.twin(owner, task)):
                        copies.append(tf.identity(value))
            out.append(copies)
        return out

    def tree_sums(self, leaf_lists: Sequence[Sequence], owners: Sequence[str], combine: Callable = add) -> list:
        """Each list of per-micro-batch leaves combined along the tree (`reduce`; by default summed), list q's
        combinations placed by `placer(owners[q])` (on `owners[q]` when the range spans tasks).
        `fused_buffers.FusedLayout` sends the partial results crossing between tasks as fused buffers
        instead of one tensor each."""
        pairs = zip(leaf_lists, owners, strict=True)
        return [reduce(list(leaves), combine, self.placer(owner)) for leaves, owner in pairs]

    def all_reduce(self, leaves: Sequence, home: str) -> dict[int, tf.Tensor]:
        """Each task's copy (on its twin of `home`) of the tree sum of `leaves`, one per micro-batch: the
        flattened leaves cut into one contiguous piece per task, piece i summed along the tree on task i's twin
        (reduce-scatter: the subtrees a task holds summed there first, as `placer` places them), then every
        task gathering the summed pieces (all-gather). Each element is the same sum, in the same order, as a
        `tree_sum` of the whole leaves."""
        shape, size, m = leaves[0].shape, leaves[0].shape.num_elements(), self.num_tasks
        widths = [(i + 1) * size // m - i * size // m for i in range(m)]
        twins = [self.twin(home, task) for task in range(m)]
        pieces = []
        for j, leaf in enumerate(leaves):
            with tf.device(self.towers[j * len(self.towers) // self.num_micro_batches]):  # the micro-batch's tower
                pieces.append(tf.split(tf.reshape(leaf, [-1]), widths))
        summed = [tree_sum([p[i] for p in pieces], self.placer(twins[i])) for i in range(m)]
        out = {}
        for task in range(m):
            with tf.device(twins[task]):
                out[task] = tf.reshape(tf.concat([tf.identity(piece) for piece in summed], 0), shape)
        return out

    def placer(self, owner: str) -> Callable[[int, int], str]:
        """`place(lo, hi)` for a value owned by `owner`: the holding task's twin, or the owner itself."""
        if self.num_tasks == 1:
            return lambda lo, hi: owner
        owner_task = self.task_of_device(owner)

        def place(lo: int, hi: int) -> str:
            task = self.task_holding(lo, hi)
            return owner if task is None or task == owner_task else self.twin(owner, task)

        return place
