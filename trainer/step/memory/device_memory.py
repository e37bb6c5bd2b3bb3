"""What a step needs on each device, counted from the placed variables and the traced step
(`--device_memory_mb`), and the check that refuses a run whose step cannot fit, before its first step.

Per device: the bytes of the variables and optimizer slots placed there plus a gradient per trainable variable
it owns (the state), and the activations one micro-batch keeps there for its backward pass (every tensor a
micro-batch's forward ops produce that its gradient ops read: TensorFlow names a gradient op "gradient_tape/"
+ the forward op's name) times the micro-batches the runner keeps in flight there (`memory_plan`: a tower's
micro-batches are not ordered, so all of them; a pipeline stage, what its schedule keeps). A stage that
recomputes its forward in its backward (`--pipeline_remat`) keeps only what its backward reads from its
forward (its inputs) per micro-batch in flight, plus, for one backward at a time, what the recomputation's
gradient ops read. A dimension unknown when the step traces (a padded length) is counted at its longest. It
counts what a step holds at its peak, not the allocator's overhead, scratch space of kernels, or the input
pipeline: a lower bound.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from trainer.settings.config import ConfigError
from trainer.step.core import spread

MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Held:
    """The tensors that ops under the name scope `made_in` produce and ops under any of the scopes `read_in`
    read: what stays alive from the one to the others."""

    made_in: str
    read_in: tuple[str, ...]
    on_device: bool = False  # only tensors made on the plan's device (a micro-batch split over devices)

    @classmethod
    def by_gradient(cls, scope: str, on_device: bool = False) -> Held:
        """What the gradient ops of the ops under `scope` read from them (TensorFlow names a gradient op
        "gradient_tape/" + the forward op's name; a shard's own backward, `models.sharded.run`, is built under
        it too); `on_device`: only what is made on the plan's device."""
        return cls(scope, (f"gradient_tape/{scope}",), on_device)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a runner keeps on one device (`memory_plan`), read off one micro-batch's ops."""

    device: str
    in_flight: int  # micro-batches alive there at once
    kept: Held  # what each of them keeps from its forward to its backward
    recomputed: Held | None = None  # what one backward holds while it runs its forward again (remat)


@dataclasses.dataclass(frozen=True)
class DeviceNeed:
    device: str
    state: int  # bytes of variables, slots and gradients placed on the device
    kept: int  # bytes one micro-batch keeps there for its backward pass
    in_flight: int  # micro-batches whose activations the device holds at once
    recomputed: int = 0  # bytes one backward at a time holds while it recomputes its forward (remat)

    @property
    def total(self) -> int:
        return self.state + self.in_flight * self.kept + self.recomputed


def needs(updater, optimizer, longest: int) -> list[DeviceNeed]:
    """What the step of a sync `updater` needs on each of its devices (`DeviceNeed`)."""
    graph = updater.step_graph()
    model = updater.model
    out = []
    for plan in updater.runner.memory_plan():
        state = _placed(model.variables, plan.device) + _placed(model.trainable_variables, plan.device)
        state += _placed(optimizer.variables, plan.device)
        kept = kept_bytes(graph, plan.kept, longest, plan.device)
        recomputed = kept_bytes(graph, plan.recomputed, longest, plan.device) if plan.recomputed else 0
        out.append(DeviceNeed(plan.device, state, kept, plan.in_flight, recomputed))
    return out


def check(needs_: list[DeviceNeed], budget_mb: int) -> None:
    """Raises ConfigError naming the device, what it needs and of what, when any need exceeds `budget_mb`."""
    worst = max(needs_, key=lambda need: need.total)
    if worst.total <= budget_mb * MIB:
        return
    recomputed = f" + {worst.recomputed / MIB:.1f} MiB recomputed in a backward" if worst.recomputed else ""
    raise ConfigError(
        f"a step needs ~{worst.total / MIB:.1f} MiB on {worst.device} (variables, slots and gradients "
        f"{worst.state / MIB:.1f} MiB + {worst.in_flight} micro-batch(es) x {worst.kept / MIB:.1f} MiB of kept "
        f"activations{recomputed}), more than --device_memory_mb={budget_mb}; cut the model over more devices "
        "(--pipeline_stages, --tensor_parallel), or lower the micro-batch (--micro_batches, --global_batch_size)"
    )


def kept_bytes(graph, held: Held, longest: int, device: str = "") -> int:
    """Bytes of the tensors `held` names in `graph`, each counted once (`held.on_device`: made on `device`)."""
    made_in, read_in = f"{held.made_in}/", tuple(f"{scope}/" for scope in held.read_in)
    here = spread.full_name(device) if held.on_device else None
    kept = {
        tensor.name
        for op in graph.get_operations()
        if op.name.startswith(read_in)
        for tensor in op.inputs
        if tensor.op.name.startswith(made_in) and (here is None or spread.full_name(tensor.op.device) == here)
    }
    return sum(_bytes(graph.get_tensor_by_name(name), longest) for name in kept)


def _bytes(tensor, longest: int) -> int:
    if tensor.shape.rank is None:
        return 0
    dims = [longest if d is None else d for d in tensor.shape.as_list()]
    return int(np.prod(dims, dtype=np.int64)) * tensor.dtype.size


def _placed(variables, device: str) -> int:
    spec = spread.full_name(device)
    here = [v for v in variables if tf.DeviceSpec.from_string(spread.device_of(v)) == spec]
    return sum(spread.variable_bytes(v) for v in here)
