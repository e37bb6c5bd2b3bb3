"""Tower and parameter devices.

A tower is a device string. GPU towers are `/device:GPU:i`; CPU towers are logical CPU devices
`/device:CPU:i` made with `tf.config.set_logical_device_configuration`. Both kinds go through the same code,
so what the tests run on logical CPUs is what runs on GPUs.

With several tasks (machines, see `trainer.system.distributed`) every task has the same `--num_gpus` devices and
the towers are `/job:worker/replica:0/task:T/device:GPU:G`, task-major: tower T*G+g. The variables stay on
the chief (task 0); each tower's input is read on its own task's CPU.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from trainer.settings.config import ConfigError, TowerConfig

HOST_DEVICE = "/device:CPU:0"


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where each part of a step runs."""

    towers: tuple[str, ...]  # one device string per tower
    parameter_device: str  # the variables and optimizer slots (spread: the step, learning rate, loss sums)
    host: str = HOST_DEVICE  # the chief's CPU: eval input, host-side bookkeeping
    spread_over: tuple[str, ...] = ()  # --parameter_device=spread: the devices owning variables (step.core.spread)
    tower_hosts: tuple[str, ...] = ()  # the CPU of each tower's task, where its input is read; () = `host`
    num_tasks: int = 1
    groups: tuple[tuple[str, ...], ...] = ()  # --tensor_parallel=T: each tower's T devices (its first is the tower)

    def group(self, tower: int) -> tuple[str, ...]:
        """The devices tower `tower`'s layers are split over (`models.sharded.placed`): itself, or its T devices."""
        return self.groups[tower] if self.groups else (self.towers[tower],)

    def host_of(self, tower: int) -> str:
        """The CPU that reads tower `tower`'s input: its own task's."""
        return self.tower_hosts[tower] if self.tower_hosts else self.host

    def describe_tower(self, tower: int) -> str:
        """How logs name a tower: `tower 3`, or `task 1 / gpu 1` (`cpu 1`) with several tasks."""
        if self.num_tasks == 1:
            return f"tower {tower}"
        task, device = self._task_and_device(tower)
        return f"task {task} / {self._kind(tower)} {device}"

    def tower_tag(self, tower: int, num_stages: int = 1) -> str:
        """How TensorBoard names a tower's device: `tower_3`, or `task_1_gpu_1` with several tasks; with pipeline
        stages, its stage after it (`tower_3_stage_1`: each pipeline is S consecutive devices of a task)."""
        stage = f"_stage_{tower % num_stages}" if num_stages > 1 else ""
        if self.num_tasks == 1:
            return f"tower_{tower}{stage}"
        task, device = self._task_and_device(tower)
        return f"task_{task}_{self._kind(tower)}_{device}{stage}"

    def device_roles(self, num_stages: int = 1, shards: int = 1) -> list[dict]:
        """Every device the towers compute on, in placement order, each with what it is: its `task` (machine),
        `tower` (with pipeline stages each stage's devices are a tower, as the banner numbers them), `pipeline`
        and `stage` (each pipeline is `num_stages` consecutive towers), and the `shards` of the split layers it
        holds (shard k of N on device k*T//N of its tower: `models.sharded`; [0] when nothing is split)."""
        per_task = len(self.towers) // self.num_tasks
        roles = []
        for tower in range(len(self.towers)):
            group = self.group(tower)
            for rank, device in enumerate(group):
                held = [k for k in range(shards) if k * len(group) // shards == rank]
                where = {"task": tower // per_task, "tower": tower}
                stage = {"pipeline": tower // num_stages, "stage": tower % num_stages}
                roles.append({"device": device, **where, **stage, "shards": held})
        return roles

    def _task_and_device(self, tower: int) -> tuple[int, int]:
        per_task = len(self.towers) // self.num_tasks
        return tower // per_task, tower % per_task

    def _kind(self, tower: int) -> str:
        return "cpu" if "CPU:" in self.towers[tower].rsplit("/", 1)[-1] else "gpu"


def task_prefix(task: int, num_tasks: int) -> str:
    """The device-name prefix of task `task`: none on one machine (the local devices)."""
    return f"/job:worker/replica:0/task:{task}" if num_tasks > 1 else ""


def configure_logical_cpus(num_devices: int) -> None:
    """Splits the physical CPU into `num_devices` logical devices, if TensorFlow has not started yet.

    Logical devices can only be configured before TensorFlow initialises its devices (before the first op).
    When it already has, the existing logical devices are kept and `place` checks there are enough.
    """
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        if len(tf.config.get_logical_device_configuration(cpu) or []) < num_devices:
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)
    except RuntimeError:
        pass  # already initialised: `place` reports a shortfall with a clear message


def place(config: TowerConfig) -> Placement:
    """The placement of a run (its towers, parameter device and each tower's host), or raises when fewer
    devices exist than asked. Decided once per run, by `trainer.loop.build.build`, which keeps it in its `Trainer`.

    Never falls back silently: `--device=gpu` with too few GPUs is an error that names `--device=cpu`.

    Raises:
      ConfigError: not enough devices of the requested kind.
    """
    kind = config.device.upper()
    if config.device == "cpu":
        configure_logical_cpus(config.num_towers)
    found = _count_devices(kind, 0, config.num_tasks)
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
    if config.num_tasks > 1:
        _require_remote_devices(kind, config)
    prefixes = [task_prefix(t, config.num_tasks) for t in range(config.num_tasks)]
    t = config.tensor_parallel  # a tower is T consecutive devices of a task (docs/tensor_parallel.md)
    every = [f"{p}/device:{kind}:{i}" for p in prefixes for i in range(config.num_towers)]
    groups = tuple(tuple(every[i : i + t]) for i in range(0, len(every), t))
    towers = tuple(group[0] for group in groups)
    hosts = tuple(f"{p}{HOST_DEVICE}" for p in prefixes for _ in range(config.towers_per_task))
    host = hosts[0]
    parameter_device = host if config.parameter_device == "cpu" else towers[0]
    spread_over = towers if config.parameter_device == "spread" else ()
    return Placement(
        towers=towers,
        parameter_device=parameter_device,
        host=host,
        spread_over=spread_over,
        tower_hosts=hosts if config.num_tasks > 1 else (),
        num_tasks=config.num_tasks,
        groups=groups if t > 1 else (),
    )


def _require_remote_devices(kind: str, config: TowerConfig) -> None:
    """Every task must have `--num_gpus` devices of the kind: the same flags run on every machine."""
    for task in range(1, config.num_tasks):
        found = _count_devices(kind, task, config.num_tasks)
        if found < config.num_towers:
            raise ConfigError(
                f"task {task} has {found} {kind} device(s) but --num_gpus={config.num_towers}; every task "
                f"of a multi-machine run needs the same --num_gpus devices (check that machine's GPUs)"
            )


def _count_devices(kind: str, task: int, num_tasks: int) -> int:
    prefix = task_prefix(task, num_tasks)
    return sum(1 for d in tf.config.list_logical_devices(kind) if d.name.startswith(prefix + "/"))


def tower_of_micro_batch(index: int, num_micro_batches: int, num_towers: int) -> int:
    """Micro-batch j runs on tower j*N//K: contiguous blocks, so tower i gets the same K/N micro-batches."""
    return index * num_towers // num_micro_batches
