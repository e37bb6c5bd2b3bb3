"""Bytes each device sends and receives per step, counted from the step's traced graph.

For every input of an op the step runs that was produced on another device, the tensor's bytes (static shape x
dtype size) are added to the producer's `sent` and the consumer's `received`, once per (tensor, consuming
device): TensorFlow's graph partitioner sends a tensor to a device once, however many ops there read it.
Resource handles and control edges carry no data and are not counted, nor are ops no output or stateful op
needs (`live_ops`): TensorFlow prunes them.

Where an op runs, as TensorFlow's placer decides it for these graphs:
- an op that takes a resource (a variable, the input iterator) runs where the resource lives, whatever its
  device string says (resource ops are always colocated with their resource);
- otherwise its device string;
- an op without one runs with the op it is colocated with (`tf.colocate_with`, which
  `tf.linalg.global_norm` and `tf.clip_by_global_norm` use), else with its first data input, else on the
  enclosing call's device (the step's default: the host).
A `tf.cond` is followed into its true branch (the update the step applies when the gradients are finite);
other function calls (an XLA-compiled tower) count as one op on their device.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import tensorflow as tf

_CONDS = ("If", "StatelessIf")


@dataclasses.dataclass
class Traffic:
    """Bytes and tensors per device (short names such as `CPU:1`) and the edges whose size was not static."""

    sent: dict[str, int]
    received: dict[str, int]
    unknown_edges: int = 0
    tensors_sent: dict[str, int] = dataclasses.field(default_factory=dict)  # transfers, each its fixed cost
    tensors_received: dict[str, int] = dataclasses.field(default_factory=dict)

    def busiest(self) -> tuple[str, int]:
        """The device moving the most bytes in one direction, and that count."""
        devices = set(self.sent) | set(self.received)
        return max(
            ((d, max(self.sent.get(d, 0), self.received.get(d, 0))) for d in sorted(devices)), key=lambda x: x[1]
        )


def short_device(device: str) -> str:
    """`/job:localhost/replica:0/task:0/device:CPU:1` -> `CPU:1` (empty stays empty)."""
    if not device:
        return ""
    spec = tf.DeviceSpec.from_string(device)
    return f"{spec.device_type}:{spec.device_index}" if spec.device_type else ""


def tensor_bytes(tensor) -> int | None:
    """Static bytes of a tensor; 0 for handles (resource, variant); None when the shape is not static."""
    if tensor.dtype in (tf.resource, tf.variant):
        return 0
    if not tensor.shape.is_fully_defined():
        return None
    return int(np.prod(tensor.shape.as_list(), dtype=np.int64)) * tensor.dtype.size


def count(graph, default_device: str = "/device:CPU:0", machine_of=None, argument_devices=()) -> Traffic:
    """Counts the bytes crossing devices in `graph` (a FuncGraph, e.g. `fn.get_concrete_function().graph`).

    Args:
      graph: the traced step.
      default_device: where ops with no device, colocation or input run (TensorFlow's default: the host).
      machine_of: optional; maps a short device name to its machine's name. Then only bytes between
        machines count, per machine (what crosses each one's network interface); a tensor still reaches
        each consuming device once, as TensorFlow sends it.
      argument_devices: where the graph's first arguments live (the input iterators, whose ops run there).
    """
    arguments = zip(graph.inputs[: len(argument_devices)], argument_devices, strict=True)
    where = {inner.ref(): short_device(device) for inner, device in arguments}
    for outer, inner in graph.captures:
        where[inner.ref()] = short_device(getattr(outer, "device", "") or "")
    counter = _Counter(machine_of or (lambda device: device))
    counter.walk(graph, where, short_device(default_device))
    tensors = dict(counter.tensors_sent), dict(counter.tensors_received)
    return Traffic(dict(counter.sent), dict(counter.received), counter.unknown, *tensors)


class _Counter:
    def __init__(self, machine_of):
        self._machine_of = machine_of
        self.sent = collections.Counter()
        self.received = collections.Counter()
        self.tensors_sent = collections.Counter()
        self.tensors_received = collections.Counter()
        self.unknown = 0
        self._seen = set()  # (tensor ref, consuming device): each tensor reaches a device once

    def walk(self, graph, where: dict, default: str) -> None:
        """Resolves every op's device in `graph` (in creation order, so inputs come first) and counts the inputs
        of the ops a call runs (`live_ops`)."""
        devices_by_name, live = {}, live_ops(graph)
        for op in graph.get_operations():
            device = self._device(op, where, devices_by_name, default)
            devices_by_name[op.name] = device
            if op.name not in live:
                continue
            if op.type in _CONDS and hasattr(op, "_true_graph"):
                self._follow_cond(op, where, device)  # its inputs go to the branch's ops, counted there
                continue
            for tensor in op.inputs:
                self._edge(tensor, where.get(tensor.ref(), ""), device)
            for output in op.outputs:
                where[output.ref()] = device

    def _device(self, op, where: dict, devices_by_name: dict, default: str) -> str:
        for tensor in op.inputs:
            if tensor.dtype == tf.resource and where.get(tensor.ref()):
                return where[tensor.ref()]  # resource ops run where their resource lives
        if op.type == "Placeholder" and where.get(op.outputs[0].ref()):
            return where[op.outputs[0].ref()]  # a captured tensor: where it was produced
        if op.device:
            return short_device(op.device)
        for group in op.colocation_groups():
            name = group.decode()[len("loc:@") :]
            if name != op.name and devices_by_name.get(name):
                return devices_by_name[name]
        for tensor in op.inputs:
            if tensor.dtype != tf.resource and where.get(tensor.ref()):
                return where[tensor.ref()]
        return default

    def _edge(self, tensor, producer: str, consumer: str) -> None:
        if not producer or producer == consumer or (tensor.ref(), consumer) in self._seen:
            return
        self._seen.add((tensor.ref(), consumer))
        producer, consumer = self._machine_of(producer), self._machine_of(consumer)
        if producer == consumer:
            return
        self.tensors_sent[producer] += 1
        self.tensors_received[consumer] += 1
        size = tensor_bytes(tensor)
        if size is None:
            self.unknown += 1
            return
        self.sent[producer] += size
        self.received[consumer] += size

    def _follow_cond(self, op, where: dict, device: str) -> None:
        """Walks the true branch with its inputs where the cond's inputs are; its outputs become the cond's."""
        branch = op._true_graph
        for outer, inner in zip(op.inputs[1:], branch.inputs, strict=True):
            where[inner.ref()] = where.get(outer.ref(), "")
        self.walk(branch, where, device)
        for output, inner in zip(op.outputs, branch.outputs, strict=True):
            where[output.ref()] = where.get(inner.ref(), device)


def live_ops(graph) -> set[str]:
    """The names of the ops a call of `graph` runs: those its outputs and control outputs (its stateful ops)
    need. TensorFlow prunes the others when it instantiates the function, so they move nothing: a gradient the
    tape makes and then drops (the zero gradient of a custom-gradient wrapper's pass-through output) is one."""
    stack = [tensor.op for tensor in graph.outputs] + list(getattr(graph, "control_outputs", ()))
    live = set()
    while stack:
        op = stack.pop()
        if op.name not in live:
            live.add(op.name)
            stack.extend(tensor.op for tensor in op.inputs)
            stack.extend(op.control_inputs)
    return live


def model_bytes(variables) -> int:
    """Bytes of all of `variables`' values."""
    return sum(int(np.prod(v.shape, dtype=np.int64)) * tf.as_dtype(v.dtype).size for v in variables)


def ideal_bytes(variables, num_devices: int) -> float:
    """What a balanced layout moves through each device per step, each way: 2(N-1)/N x model bytes."""
    return 2 * (num_devices - 1) / num_devices * model_bytes(variables)
