"""The update modes: what differs between sync and async, in one place. A third mode implements `UpdateMode`
(and an `trainer.step.stepper.Updater`) and registers in `MODES`; nothing else branches on --update_mode.

`settle` makes a run's decisions that need no TensorFlow once, at the entry point: the settings resolved and
checked, and the `UpdateMode` object, in one `Plan` that `train` and `build` take and pass down. Nothing else
looks this run's mode up by name.

No TensorFlow import at module level: the entry point checks settings (`UpdateMode.check`) before TensorFlow
is imported, which takes seconds. The steppers (`trainer.step.sync`, `trainer.step.asynchronous`) are imported by
`build`.
"""

from __future__ import annotations

import abc
import dataclasses
import logging

from trainer.settings.config import ConfigError, RunConfig
from trainer.settings.resolve import resolve
from trainer.step.stepper import Updater

log = logging.getLogger("towerflow")


class UpdateMode(abc.ABC):
    """One --update_mode: its checks, input layout, optimizer, what it records, and its `Updater`."""

    name: str
    # Settings (as `trainer.settings.config.flatten` names them) a resume may change in this mode, beyond the
    # flag table's FREE ones (`trainer.settings.table`).
    resume_may_change: frozenset[str] = frozenset()
    # Whether a step of this mode has micro-batches to send through pipeline stages (`Pipeline.check`).
    runs_pipelines: bool = False

    def check(self, config: RunConfig) -> None:
        """Raises ConfigError, naming the flags and what to change, for settings this mode cannot run."""
        return  # a mode without restrictions

    @abc.abstractmethod
    def stream_towers(self, config: RunConfig, num_towers: int) -> list[int]:
        """The tower of each training input stream, in stream order (each stream is read on its tower's host)."""

    def make_optimizer(self, config: RunConfig, global_step):
        """The optimizer, its learning rate a function of `global_step` (`optimizers.make_optimizer`)."""
        from trainer.step.update import optimizers

        return optimizers.make_optimizer(config.optimizer, config.loop.train_steps, global_step)

    def hparams(self, config: RunConfig) -> dict:
        """The HParams this mode adds to `trainer.outputs.summaries.run_hparams`."""
        return {}

    def run_metrics(self, config: RunConfig, updater: Updater) -> dict:
        """What this mode adds to metrics.json, over the run of `updater`."""
        return {}

    def build(self, task, model, optimizer, placement, global_step, iterators, config: RunConfig) -> Updater:
        """The stepper of `task`'s `model`: `iterators` are the streams `stream_towers` laid out. What every
        mode's updater takes (`trainer.step.update.apply.BaseUpdate`, and the towers' compile) is passed here,
        once; the mode adds its own (`updater`)."""
        shared = {
            "task": task,
            "model": model,
            "optimizer": optimizer,
            "placement": placement,
            "global_step": global_step,
            "iterators": iterators,
            "clip_global_norm": config.optimizer.clip_global_norm,
            "jit_compile": config.towers.jit_compile,
        }
        return self.updater(shared, config)

    @abc.abstractmethod
    def updater(self, shared: dict, config: RunConfig) -> Updater:
        """This mode's `Updater` from the arguments every mode's takes (`build`) and its own settings."""


class SyncMode(UpdateMode):
    """K micro-batches per step, their gradients averaged in a fixed order, one update (`trainer.step.sync`)."""

    name = "sync"
    runs_pipelines = True
    # With K fixed, the towers (on one machine or several) do not change the sync result.
    resume_may_change = frozenset({"towers.num_towers", "towers.num_tasks"})

    def stream_towers(self, config: RunConfig, num_towers: int) -> list[int]:
        from trainer.system.devices import tower_of_micro_batch

        k = config.towers.num_micro_batches
        return [tower_of_micro_batch(j, k, num_towers) for j in range(k)]

    def run_metrics(self, config: RunConfig, updater: Updater) -> dict:
        """The variables kept on every task, their gradients all-reduced (`trainer.step.transfers.mirrors`)."""
        variables = updater.model.trainable_variables
        return {
            "mirrored_variables": [variables[i].path for i in updater.mirrors.indices],
            **updater.runner.run_metrics(updater.last_timings),
        }

    def updater(self, shared: dict, config: RunConfig) -> Updater:
        from trainer.step.sync.sync_update import SyncUpdate
        from trainer.step.update import optimizers

        global_step = shared["global_step"]
        return SyncUpdate(
            **shared,
            num_micro_batches=config.towers.num_micro_batches,
            steps_per_call=config.loop.steps_per_call,
            profile_steps=config.loop.profile_steps,
            make_optimizer=lambda: optimizers.with_precision(
                self.make_optimizer(config, global_step), config.towers.mixed_precision
            ),
            pipeline=config.towers.pipeline,
            fuse_transfers=config.towers.fuse_transfers,
        )


class AsyncMode(UpdateMode):
    """Every tower updates on its own, one micro-batch per update (`trainer.step.asynchronous.async_update`)."""

    name = "async"
    resume_may_change = frozenset({"towers.gradient_order"})  # no sum of gradients: each update is one's own

    def check(self, config: RunConfig) -> None:
        if config.deterministic:
            raise ConfigError(
                "--update_mode=async cannot be --deterministic: async updates land in thread-timing order. "
                "Use --update_mode=sync for bitwise reproducible training."
            )
        if config.towers.mixed_precision == "fp16":
            raise ConfigError(
                "--mixed_precision=fp16 cannot be --update_mode=async: a gradient in flight would be unscaled with "
                "the loss scale of the moment it lands, not the one it was computed with (2x or 0.5x updates). Use "
                "--mixed_precision=bf16 (no loss scaling) with async, or sync with fp16."
            )
        if config.runtime.device_memory_mb:
            raise ConfigError(
                f"--device_memory_mb ({config.runtime.device_memory_mb}) is counted from a sync step; async towers "
                "trace their own: leave it at 0 with --update_mode=async"
            )
        if config.loop.steps_per_call:
            raise ConfigError(
                f"--steps_per_call ({config.loop.steps_per_call}) is for --update_mode=sync: async towers size their "
                "own calls (several updates each without --max_staleness, one with it). Leave it at 0 with async."
            )

    def stream_towers(self, config: RunConfig, num_towers: int) -> list[int]:
        return list(range(num_towers))

    def make_optimizer(self, config: RunConfig, global_step):
        """Scales each update's learning rate by 1/K (K updates ~ one sync step) and lowers the explicit
        momentum by what asynchrony adds (`optimizers.async_momentum`)."""
        from trainer.step.update import optimizers

        t = config.towers
        momentum = optimizers.async_momentum(config.optimizer.momentum, t.total_towers)
        if config.optimizer.name == "momentum":
            log.warning(
                "async: explicit momentum %.3g instead of %.3g (N=%d towers add implicit momentum)",
                momentum,
                config.optimizer.momentum,
                t.total_towers,
            )
        return optimizers.make_optimizer(
            config.optimizer,
            config.loop.train_steps,
            global_step,
            lr_scale=1.0 / t.num_micro_batches,
            momentum=momentum,
        )

    def hparams(self, config: RunConfig) -> dict:
        return {"max_staleness": config.towers.max_staleness}

    def run_metrics(self, config: RunConfig, updater: Updater) -> dict:
        """Staleness over every update of this process (a resumed run counts from its restart)."""
        staleness = updater.staleness_all
        if not staleness:
            return {}
        return {
            "staleness_mean": sum(staleness) / len(staleness),
            "staleness_max": max(staleness),
            "staleness_updates": len(staleness),
            "max_staleness": config.towers.max_staleness,
        }

    def updater(self, shared: dict, config: RunConfig) -> Updater:
        from trainer.step.asynchronous.async_update import AsyncUpdate

        return AsyncUpdate(**shared, max_staleness=config.towers.max_staleness)


MODES: dict[str, UpdateMode] = {mode.name: mode for mode in (SyncMode(), AsyncMode())}


def mode_for(name: str) -> UpdateMode:
    """The mode of `--update_mode=name`.

    Raises:
      ConfigError: no such mode; names the flag and the modes there are.
    """
    try:
        return MODES[name]
    except KeyError:
        raise ConfigError(f"--update_mode ({name!r}) must be one of {tuple(MODES)}") from None


@dataclasses.dataclass(frozen=True)
class Plan:
    """A run's settled decisions, made once at its entry point and passed down: nothing below `settle`
    resolves the settings again or looks the update mode up by name.

    Attributes:
      config: the settings as resolved (`trainer.settings.resolve.resolve`) and checked by the mode.
      mode: the `UpdateMode` object of `config.towers.update_mode`.
    """

    config: RunConfig
    mode: UpdateMode

    @property
    def num_tasks(self) -> int:
        """The tasks (machines) of the run, as the cluster decided them at the entry point."""
        return self.config.towers.num_tasks


def settle(config: RunConfig, num_tasks: int | None = None) -> Plan:
    """The plan a run goes with: `trainer.settings.resolve.resolve` (validated, what the settings alone decide
    decided, `num_tasks` when given), its update mode found, the pipeline's rules (`Pipeline.check`, which
    need the mode) and that mode's own `check`. The entry points call
    it once (`python -m trainer`, `launch.slurm`'s pre-check, and `train`, `build` when handed a raw
    `RunConfig`: `planned`).

    Raises:
      ConfigError: naming the flag and what to change.
    """
    config = resolve(config, num_tasks)
    mode = mode_for(config.towers.update_mode)
    config.towers.pipeline.check(config.towers, mode.runs_pipelines)
    config.towers.tensor.check(config.towers, mode.runs_pipelines)
    mode.check(config)
    return Plan(config, mode)


def planned(run: RunConfig | Plan) -> Plan:
    """`run` itself when it is a `Plan` (already settled: nothing is decided again), else `settle(run)`: how the
    library entry points (`train`, `build`) take either."""
    return run if isinstance(run, Plan) else settle(run)
