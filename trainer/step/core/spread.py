"""`--parameter_device=spread`: every variable and its optimizer slots live on one tower's device.

With one parameter device, that device receives every micro-batch's gradient of every variable and sends a
copy of every variable to every other tower each step. Spread over the N towers, each device owns about 1/N
of the model's bytes and moves about 2(N-1)/N x model bytes per step (`trainer.step.transfers.traffic` measures it).

The assignment is greedy by bytes in `model.variables` order: each variable goes to the device holding the
fewest bytes so far, ties to the lowest index. It depends only on the variables' shapes and dtypes, so it is
the same in every process and on every rerun. The arithmetic of a step is unchanged (the same tree of adds,
`trainer.step.core.tree`); only where each op runs changes, so the weights are bitwise those of
`--parameter_device=gpu|cpu`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import numpy as np
import tensorflow as tf


def variable_bytes(variable) -> int:
    """Bytes of one variable's value (static shape x dtype size)."""
    return int(np.prod(variable.shape, dtype=np.int64)) * tf.as_dtype(variable.dtype).size


def assign(sizes: list[int], num_devices: int, later: Sequence[bool] = ()) -> list[int]:
    """Device index of each variable: greedy, in the given order, to the least-loaded device (lowest index
    on a tie). The busiest device then holds at most the mean plus one variable: its last variable arrived
    when it was the least loaded, so before it, it held no more than the final mean. Variables flagged in
    `later` (mirrored ones, whose traffic does not depend on their owner) are assigned after the others, so
    that the others are balanced among themselves."""
    loads = [0] * num_devices
    owners = [0] * len(sizes)
    flags = list(later) or [False] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: flags[i]):  # stable: model order within each group
        device = loads.index(min(loads))  # index() finds the first minimum: the lowest index on a tie
        loads[device] += sizes[index]
        owners[index] = device
    return owners


@contextlib.contextmanager
def _record_creation(created: list):
    """Appends every tf.Variable created inside to `created`, in creation order."""

    def creator(next_creator, **kwargs):
        variable = next_creator(**kwargs)
        created.append(variable)
        return variable

    with tf.variable_creator_scope(creator):
        yield


@contextlib.contextmanager
def _place_creation(devices_in_order: list):
    """Creates the i-th tf.Variable under `devices_in_order[i]` (None, or past the end: the ambient device)."""
    count = [0]

    def creator(next_creator, **kwargs):
        index, count[0] = count[0], count[0] + 1
        device = devices_in_order[index] if index < len(devices_in_order) else None
        with tf.device(device):
            return next_creator(**kwargs)

    with tf.variable_creator_scope(creator):
        yield


def build_spread(build_fn, devices: tuple[str, ...], reseed, later=None, owners_of=None):
    """Builds the model twice: once to learn its variables, then with each variable created on its owner.

    Keras creates a layer's variables when the layer is built, before the model's variable order is known,
    so the first build gives shapes and the order in which tf.Variables are created; the second build,
    after `reseed()` restores the RNG state the first one started from, draws the same initial values
    (tested: same `weights_sha256` as a single build) and places each tf.Variable as it is created.

    Args:
      build_fn: () -> built keras.Model.
      devices: the devices to spread over, in tower order.
      reseed: () -> None; resets the random state to what `build_fn` saw the first time.
      later: (model) -> one flag per `model.variables`: those assigned after the others (see `assign`).
      owners_of: (model) -> the index in `devices` of each of `model.variables`, instead of `assign`'s
        (pipeline stages: each variable on its stage's device).

    Raises:
      RuntimeError: the second build did not create its variables in the order of the first.
    """
    created: list = []
    with _record_creation(created):
        probe = build_fn()
    if owners_of is not None:
        owners = owners_of(probe)
    else:
        owners = assign([variable_bytes(v) for v in probe.variables], len(devices), later(probe) if later else ())
    creation_index = {id(variable): i for i, variable in enumerate(created)}
    devices_in_order: list = [None] * len(created)
    for variable, owner in zip(probe.variables, owners, strict=True):
        devices_in_order[creation_index[id(variable.value)]] = devices[owner]
    del probe, created
    reseed()
    with _place_creation(devices_in_order):
        model = build_fn()
    for variable, owner in zip(model.variables, owners, strict=True):
        if tf.DeviceSpec.from_string(variable.value.device) != full_name(devices[owner]):
            raise RuntimeError(f"{variable.path} was built on {variable.value.device}, not {devices[owner]}")
    return model


def full_name(device: str) -> tf.DeviceSpec:
    """`device` completed the way TensorFlow names a local variable's device."""
    return tf.DeviceSpec.from_string("/job:localhost/replica:0/task:0").make_merged_spec(
        tf.DeviceSpec.from_string(device)
    )


def device_of(variable) -> str:
    """The device holding a Keras or tf variable."""
    return variable.device if isinstance(variable, tf.Variable) else variable.value.device


def read_values(variables) -> list[tf.Tensor]:
    """Each variable's current value, read on its own device.

    identity: a bare read is forwarded into function calls as the variable itself, which an XLA cluster on
    another tower's device may not touch; a tensor copied to the tower is what it needs.
    """
    values = []
    for variable in variables:
        with tf.device(device_of(variable)):
            values.append(tf.identity(variable.value))
    return values


def parameter_devices(variables) -> list[str]:
    """The sorted devices holding `variables` (for metrics.json)."""
    return sorted({device_of(v) for v in variables})
