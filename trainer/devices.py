"""Tower and parameter devices.

A tower is a device string. GPU towers are `/device:GPU:i`; CPU towers are logical CPU devices
`/device:CPU:i` made with `tf.config.set_logical_device_configuration`. Both kinds go through the same code,
so what the tests run on logical CPUs is what runs on GPUs.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from trainer.config import ConfigError, TowerConfig

HOST_DEVICE = "/device:CPU:0"


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where each part of a step runs."""

    towers: tuple[str, ...]  # one device string per tower
    parameter_device: str  # the variables and optimizer slots (spread: the step, learning rate, loss sums)
    host: str = HOST_DEVICE  # input pipeline and the split of the global batch
    spread_over: tuple[str, ...] = ()  # --parameter_device=spread: the devices owning variables (trainer.spread)


def configure_logical_cpus(num_devices: int) -> None:
    """Splits the physical CPU into `num_devices` logical devices, if TensorFlow has not started yet.

    Logical devices can only be configured before TensorFlow initialises its devices (before the first op).
    When it already has, the existing logical devices are kept and `resolve` checks there are enough.
    """
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        if len(tf.config.get_logical_device_configuration(cpu) or []) < num_devices:
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)
    except RuntimeError:
        pass  # already initialised: `resolve` reports a shortfall with a clear message


def resolve(config: TowerConfig) -> Placement:
    """Returns the devices of a run, or raises when fewer devices exist than asked.

    Never falls back silently: `--device=gpu` with too few GPUs is an error that names `--device=cpu`.

    Raises:
      ConfigError: not enough devices of the requested kind.
    """
    kind = config.device.upper()
    if config.device == "cpu":
        configure_logical_cpus(config.num_towers)
    found = len(tf.config.list_logical_devices(kind))
    if found < config.num_towers:
        if config.device == "gpu":
            raise ConfigError(
                f"--num_gpus={config.num_towers} asks for {config.num_towers} GPU towers but TensorFlow sees "
                f"{found} GPU(s) (check CUDA_VISIBLE_DEVICES and the CUDA install). To train on CPU devices "
                f"instead, pass --device=cpu."
            )
        raise ConfigError(
            f"--num_gpus={config.num_towers} with --device=cpu needs {config.num_towers} logical CPU devices, "
            f"but TensorFlow was already initialised with {found}; configure them before the first op."
        )
    towers = tuple(f"/device:{kind}:{i}" for i in range(config.num_towers))
    parameter_device = HOST_DEVICE if config.parameter_device == "cpu" else towers[0]
    spread_over = towers if config.parameter_device == "spread" else ()
    return Placement(towers=towers, parameter_device=parameter_device, spread_over=spread_over)


def tower_of_micro_batch(index: int, num_micro_batches: int, num_towers: int) -> int:
    """Micro-batch j runs on tower j*N//K: contiguous blocks, so tower i gets the same K/N micro-batches."""
    return index * num_towers // num_micro_batches
