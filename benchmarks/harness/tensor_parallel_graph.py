"""What a traced tensor-parallel step's graph moves between devices and keeps for its backward, by device and by
kind of tensor (`count`): `trainer.step.transfers.traffic`'s walk, with every dimension unknown at trace counted
at its size. Read by `python -m benchmarks.probes tensor_parallel`; imports TensorFlow only when called.
"""

from __future__ import annotations

import collections
import math

from benchmarks.harness.tensor_parallel_formulas import Size


def count(graph, host: str, size: Size):
    """`traffic.count`'s walk over the step graph, with two differences: a dimension unknown when the step
    traces is counted at its size here (a leading one, the flattened positions of an embedding's gradient, at
    b x s; any other, the padded length, at s: every record is full), where `traffic.count` skips the edge;
    and each edge's bytes are also added to a kind (`_kind`)."""
    from trainer.step.transfers import traffic

    counter = _KindCounter(size)
    where = {inner.ref(): traffic.short_device(getattr(outer, "device", "") or "") for outer, inner in graph.captures}
    counter.walk(graph, where, traffic.short_device(host))
    return counter


def _kind_counter_class():
    from trainer.step.transfers import traffic

    class KindCounter(traffic._Counter):
        def __init__(self, size: Size):
            super().__init__(lambda device: device)
            self.size, self.kinds = size, collections.Counter()
            self._consumer = None

            self.device_of = {}

        def _device(self, op, *args):
            self._consumer = op
            self.device_of[op.name] = super()._device(op, *args)
            return self.device_of[op.name]

        def kept_for_backward(self, graph, device: str) -> int:
            return _kept_for_backward(graph, device, self.device_of, self._bytes)

        def _edge(self, tensor, producer, consumer):
            if not producer or producer == consumer or (tensor.ref(), consumer) in self._seen:
                return
            self._seen.add((tensor.ref(), consumer))
            size = self._bytes(tensor)
            self.sent[producer] += size
            self.received[consumer] += size
            self.tensors_sent[producer] += 1
            self.tensors_received[consumer] += 1
            self.kinds[_kind(tensor, self._consumer)] += size

        def _bytes(self, tensor) -> int:
            return 0 if traffic.tensor_bytes(tensor) == 0 else _filled_bytes(tensor, self.size)

    return KindCounter


def _filled_bytes(tensor, size: Size) -> int:
    """A tensor's bytes, an unknown leading dimension at b x s (flattened positions), any other at s."""
    if tensor.shape.rank is None:
        return 0
    dims = [d if d is not None else size.positions if i == 0 else size.context for i, d in enumerate(tensor.shape)]
    return math.prod(dims) * tensor.dtype.size


def _kept_for_backward(graph, device: str, device_of: dict, size_of) -> int:
    """Bytes of the tensors forward ops make on `device` that any gradient op reads: the tape's
    (`gradient_tape/...`) and a shard's own (`tf.gradients`' `.../gradients_K/...`), counted once, each
    dimension unknown at trace at its size (as the traffic); variables' values and constants left out."""
    kept = {}
    for op in graph.get_operations():
        if not _is_gradient(op.name):
            continue
        for tensor in op.inputs:
            made = tensor.op
            if _is_gradient(made.name) or _kind(tensor, op) in ("weights", "scalars") or made.type == "Const":
                continue  # a variable's value is state, not an activation
            if device_of.get(made.name) == device:
                kept[tensor.name] = size_of(tensor)
    return sum(kept.values())


def _KindCounter(size: Size):  # noqa: N802 (a class made when TensorFlow is imported)
    return _kind_counter_class()(size)


def _kind(tensor, consumer) -> str:
    """What an edge carries: `weights` (a variable's value read on its device, consumed elsewhere), `scalars`
    (rank 0: the optimizer's step and learning rate, the gradient norm's parts), `embedding gradient` (a
    shard's gradient rows and their densified sum), else `activations` (activations, their gradients, ids,
    targets, the mask, the softmax's numbers per position)."""
    op = tensor.op
    if op.type == "Identity" and op.inputs and op.inputs[0].op.type == "ReadVariableOp":
        return "weights"
    if op.type == "ReadVariableOp" or tensor.shape.rank == 0:
        return "scalars"
    if "GatherV2_grad" in op.name or op.type == "UnsortedSegmentSum":
        return "embedding gradient"
    if op.type == "IdentityN" or consumer.type == "IdentityN":
        return "custom-gradient IdentityN"
    if op.name.startswith("gradient_tape/"):
        return "tape gradient"
    return "activations"


def _is_gradient(name: str) -> bool:
    return name.startswith("gradient_tape/") or "/gradients" in name
