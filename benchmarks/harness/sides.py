"""Building the side of a figure inside a worker: towerflow through its public `build()`, or a reference.

Every side has `window(steps) -> (seconds, examples)` and `close()`. A step is one global batch, whatever
the side: an async towerflow side applies global_batch / micro_batch updates per step, so both sides of
a figure train on the same number of examples per window.
"""

from __future__ import annotations

import os
import time

from benchmarks.harness import inputs, reference, slow_tower
from benchmarks.harness.plan import Setting, Side
from trainer.loop.build import build
from trainer.outputs.progress import ProgressLine
from trainer.outputs.summaries import Summaries, variable_tags
from trainer.settings.config import LoopConfig, ModelConfig, OptimizerConfig, RunConfig, RuntimeConfig, TowerConfig


def run_config(side: Side, setting: Setting, records: dict, model_dir: str) -> RunConfig:
    """towerflow's config for `side`: the reference's optimizer, logical CPU towers, nothing but training.
    Its runtime options are those the worker was started with (`build` checks they are in force)."""
    return RunConfig(
        data=inputs.data_config(setting, records, side.augment),
        model=ModelConfig(setting.model),
        optimizer=OptimizerConfig(
            name="momentum", learning_rate=reference.LEARNING_RATE, momentum=reference.MOMENTUM, schedule="constant"
        ),
        towers=TowerConfig(
            num_towers=side.towers,
            device="cpu",
            parameter_device="cpu",
            global_batch_size=setting.global_batch_size,
            update_mode=side.update_mode,
            jit_compile=side.jit_compile,
            mixed_precision=side.mixed_precision,
        ),
        loop=LoopConfig(model_dir=model_dir, train_steps=10**9, histogram_every_steps=side.histogram_every_steps),
        runtime=RuntimeConfig(
            onednn=side.onednn, inter_op_threads=side.inter_op_threads, intra_op_threads=side.intra_op_threads
        ),
        seed=reference.SEED,
        deterministic=side.deterministic,
    )


class TowerflowSide:
    """A built towerflow Trainer, stepped through `trainer.updater.train_steps` as `trainer.loop.controller.Loop`
    does."""

    def __init__(self, side: Side, setting: Setting, records: dict, model_dir: str):
        config, dataset = self.config_and_dataset(side, setting, records, model_dir)
        self.trainer = build(config, train_dataset=dataset)
        self.updater = self.trainer.updater
        if side.slow_factor > 1:
            slow_tower.install(self.updater, side.towers - 1, side.slow_factor)
        per_update = self.updater.examples_per_step
        self.updates_per_step = setting.global_batch_size // per_update
        self.examples_per_update = per_update
        self.summaries = Summaries(model_dir) if side.histogram_every_steps else None
        self.progress = None
        if side.live_progress:  # as the loop draws it on a terminal, into /dev/null
            latest = lambda: self.updater.latest_loss  # noqa: E731
            self._devnull = open(os.devnull, "w")  # noqa: SIM115 (closed in close())
            self.progress = ProgressLine(
                self._devnull, 10**9, setting.global_batch_size, self.updater.global_step, latest
            )
        variables = self.trainer.model.trainable_variables
        self.histogram_args = (variable_tags(variables), variables)

    def config_and_dataset(self, side: Side, setting: Setting, records: dict, model_dir: str):
        """(RunConfig, the memory micro-batches or None for the records): an image setting's; a task's sides
        override it (benchmarks/harness/lm.py)."""
        config = run_config(side, setting, records, model_dir)
        dataset = None
        if side.input == "memory":
            # every input stream (one per micro-batch index in sync, per tower in async) reads micro-batches
            dataset = inputs.memory_dataset(setting, records, config.towers.micro_batch_size)
        return config, dataset

    def window(self, steps: int) -> tuple[float, int]:
        updates = steps * self.updates_per_step
        start = time.perf_counter()
        should_stop = None
        if self.progress is not None:
            self.progress.window_started(int(self.updater.global_step.numpy()))
            should_stop = self._tick
        # The result holds host values: the window's last step has run, as for the loop.
        result = self.updater.train_steps(updates, want_gradients=self.summaries is not None, should_stop=should_stop)
        if self.summaries is not None:
            step = int(self.updater.global_step.numpy())
            self.summaries.histograms(step, self.histogram_args[0], result.gradients, self.histogram_args[1])
        return time.perf_counter() - start, updates * self.examples_per_update

    def stats(self) -> dict:
        """Staleness over every update this side ran (async only), as metrics.json reports it."""
        staleness = self.updater.staleness_all
        if not staleness:
            return {}
        return {"staleness_mean": sum(staleness) / len(staleness), "staleness_max": max(staleness)}

    def _tick(self) -> bool:
        self.progress.tick()
        return False

    def close(self) -> None:
        if self.progress is not None:
            self._devnull.close()
        self.updater.close()  # the async mode stops its tower threads
        if self.summaries is not None:
            self.summaries.close()
