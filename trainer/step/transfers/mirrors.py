"""Large variables kept on every task: their gradients all-reduced, each task's copy updated where it is.

Spread over M tasks, a variable owned whole makes its owner send it to M-1 tasks and receive M-1 partial sums
of its gradient: (M-1) x its bytes each way. When one variable is most of the model (the cnn's Dense kernel
is 87% of it), no assignment of whole variables comes near the ring bound of 2(M-1)/M x the model's bytes
per task and direction. A *mirrored* variable instead has a copy on every task (the model's variable on its
owner, the *home*; a replica on every other task's twin of the home, `trainer.step.core.tree.Layout.twin`), and:

- its gradient is summed as M contiguous pieces of the flattened tensor, piece i on task i (reduce-scatter:
  each piece along the same tree over micro-batches, `Layout.all_reduce`), and every task gathers the M
  summed pieces (all-gather): (M-1)/M of its bytes each way, twice;
- every task applies the update to its own copy, with an optimizer of its own built like the run's (same
  class, settings and learning rate, read from the global step), with the same clipping; the home's copy is
  the model's variable, updated by the run's optimizer. Nothing is sent for the towers to read it.

Summing pieces adds the same numbers in the same order as summing the whole tensor, and the updates are the
same arithmetic on the same values, so every copy is bitwise the model's variable and the weights are those
of any other placement. The replicas and their optimizers are not checkpointed: they are set from the
model's variable and the run's optimizer (slots, iteration count) before the first step of a process
(`sync`), so a checkpoint does not depend on the layout that wrote it.

Which variables: under `--parameter_device=spread` on M > 1 tasks, each trainable variable holding at least
1/(4M) of the model's bytes (`choose`). Not with a loss-scale optimizer (fp16): it decides to skip an update
from every gradient at once, which a replica's optimizer cannot see; such runs own every variable whole.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from trainer.step.core import spread

# A trainable variable is mirrored when it holds at least 1/(SHARE x M) of the model's bytes.
from trainer.step.update import per_device
from trainer.system import graphs

# A trainable variable is mirrored when it holds at least 1/(SHARE x M) of the model's bytes.
SHARE = 4


def choose(variables, num_tasks: int, spread_over: tuple, loss_scaled: bool) -> list[int]:
    """Indices into `variables` (the trainable ones, in model order) of those to mirror; `loss_scaled`: the
    optimizer is a `LossScaleOptimizer` (fp16)."""
    if num_tasks == 1 or not spread_over or loss_scaled:
        return []
    sizes = [spread.variable_bytes(v) for v in variables]
    return [i for i, size in enumerate(sizes) if size * SHARE * num_tasks >= sum(sizes)]


def flags(model, num_tasks: int, spread_over: tuple, loss_scaled: bool) -> list[bool]:
    """`choose` as one flag per `model.variables` (`trainer.step.core.spread.build_spread` assigns them last)."""
    chosen = {
        id(model.trainable_variables[i]) for i in choose(model.trainable_variables, num_tasks, spread_over, loss_scaled)
    }
    return [id(v) in chosen for v in model.variables]


def _slot_key(optimizer_variable, homes: dict[str, str]) -> str:
    """The name, in the run's optimizer, of a replica optimizer's variable: a replica's slot by its home
    variable's slot name (`homes`: replica prefix -> home prefix), anything else (the iteration count) by its
    own name."""
    name = optimizer_variable.path.split("/", 1)[-1]
    for replica_prefix, home_prefix in homes.items():
        if name.startswith(replica_prefix + "_"):
            return home_prefix + name[len(replica_prefix) :]
    return name


class Mirrors:
    """The replicas of the mirrored variables, their optimizers, and the dataflow that keeps them equal.

    Args:
      model: the model; `indices` index its trainable variables.
      indices: which to mirror (`choose`); none: every method is the identity of the unmirrored step.
      layout: the run's `trainer.step.core.tree.Layout`.
      make_optimizer: () -> a new optimizer like the run's (its learning rate read from the global step).
      optimizer: the run's optimizer (built), whose state the replicas' optimizers copy in `sync`.
    """

    def __init__(self, model, indices: list[int], layout, make_optimizer, optimizer):
        self.indices = list(indices)
        self.layout = layout
        self._variables = model.trainable_variables
        self._optimizer = optimizer
        self.homes = {i: spread.device_of(self._variables[i]) for i in self.indices}
        self.replicas: dict[int, dict[int, keras.Variable]] = {t: {} for t in range(layout.num_tasks)}
        for i in self.indices:
            home = self.homes[i]
            for task in range(layout.num_tasks):
                if task != layout.task_of_device(home):
                    self.replicas[task][i] = self._replica(self._variables[i], layout.twin(home, task), task)
        self.optimizers = {}
        for task, replicas in self.replicas.items():
            if replicas:
                with tf.device(layout.hosts[task]):
                    self.optimizers[task] = make_optimizer()
                    self.optimizers[task].build(list(replicas.values()))

    @staticmethod
    def _replica(variable, device: str, task: int):
        value = spread.read_values([variable])[0]  # a tensor: a keras.Variable given a tf.Variable shares it
        with tf.device(device):
            return keras.Variable(value, name=f"{_prefix(variable)}_task{task}", dtype=variable.dtype)

    def fanout(self, values, owners):
        """Per task, the values its towers read (`Layout.fanout` of `values` on their `owners`): a mirrored
        variable's own copy on each task."""
        local = {}
        for task, replicas in self.replicas.items():  # read as `spread.read_values` reads (a tensor, for XLA)
            values_read = spread.read_values(replicas.values())
            local.update({(task, i): value for i, value in zip(replicas, values_read, strict=True)})
        return self.layout.fanout(values, owners, local)

    def all_reduce(self, index: int, leaves: list) -> dict[int, tf.Tensor]:
        """Each task's copy of the tree sum of variable `index`'s per-micro-batch gradients `leaves`."""
        return self.layout.all_reduce(leaves, self.homes[index])

    def apply(self, replica_grads: dict[int, dict[int, tf.Tensor]], clip) -> None:
        """Applies each task's gradients (`clip`ped as the run's are) to its replicas with its optimizer."""
        for task, optimizer in self.optimizers.items():
            replicas = self.replicas[task]
            grads = clip([replica_grads[task][i] for i in replicas])
            per_device.apply_gradients(optimizer, grads, list(replicas.values()))

    def sync(self) -> None:
        """Sets every replica and its optimizer's state from the model's variable and the run's optimizer (before
        a process's first step: after a fresh start or a restore)."""
        if self.indices:
            self._sync()

    @graphs.function
    def _sync(self):
        main = {v.path.split("/", 1)[-1]: v for v in self._optimizer.variables}
        for task, optimizer in self.optimizers.items():
            replicas = self.replicas[task]
            for i, replica in replicas.items():
                replica.assign(spread.read_values([self._variables[i]])[0])
            homes = {_prefix(r): _prefix(self._variables[i]) for i, r in replicas.items()}
            for variable in optimizer.variables:
                variable.assign(main[_slot_key(variable, homes)].value)


def _prefix(variable) -> str:
    """How Keras's optimizers prefix a variable's slot names."""
    return variable.path.replace("/", "_")
