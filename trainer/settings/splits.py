"""How the model is split over a task's devices: between layers into pipeline stages (`Pipeline`), and inside
its wide layers into tensor-parallel shards (`TensorSplit`). Each is the one form of its flags that every reader
takes (`TowerConfig.pipeline`, `TowerConfig.tensor`), with its rules in one place (`check`, which
`trainer.step.modes.settle` runs once the update mode is known, with the run's `TowerConfig` as `towers`: not
imported here, since `trainer.settings.config` builds these values)."""

from __future__ import annotations

import dataclasses
import re

from trainer.settings.errors import ConfigError
from trainer.settings.errors import require as _require


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """How a model is cut into pipeline stages and run through them (`trainer.step.pipeline.runner`); 1 stage: none."""

    stages: int = 1  # S
    schedule: str = "1f1b"
    cuts: tuple[str, ...] = ()  # the pieces that end stages 0..S-2 (`models.stages.cut`); empty: by bytes
    remat: bool = False  # a stage keeping several micro-batches recomputes its forward (`trainer.step.pipeline`)

    def check(self, towers, mode_runs_pipelines: bool) -> None:
        """Every rule of the --pipeline_* settings, in one place; `modes.settle` runs it once the update mode is
        known (`UpdateMode.runs_pipelines`: whether its step has micro-batches to send through stages).

        Raises:
          ConfigError: naming the flags and what to change.
        """
        s, cuts = self.stages, self.cuts
        _require(
            not cuts or len(cuts) == s - 1,
            f"--pipeline_cuts names {len(cuts)} place(s) and --pipeline_stages={s} needs {s - 1}: each names the "
            "layer that ends one stage, the last stage ends with the model",
        )
        _require(
            s > 1 or not self.remat,
            "--pipeline_remat needs --pipeline_stages > 1: it recomputes each stage's forward pass in its backward "
            "pass; drop it, or cut the model into stages",
        )
        if s > 1:
            self._check_devices(towers, mode_runs_pipelines)

    def _check_devices(self, towers, mode_runs_pipelines: bool) -> None:
        """The rules of S > 1 stages: whole pipelines on each task, the mode and the options they cannot take."""
        s = self.stages
        _require(
            mode_runs_pipelines,
            f"--pipeline_stages ({s}) needs --update_mode=sync: a pipeline's stages share one step's micro-batches, "
            "which async towers do not have",
        )
        per_task, t = towers.towers_per_task, towers.tensor_parallel
        _require(
            per_task % s == 0,
            f"--pipeline_stages ({s}) must divide the towers of a task (--num_gpus={towers.num_towers}"
            + (f" / --tensor_parallel={t} = {per_task}" if t > 1 else "")
            + "): each task's towers form whole pipelines (a pipeline never spans machines)",
        )
        _require(
            towers.parameter_device != "spread",
            "--parameter_device=spread cannot be used with --pipeline_stages: each stage's variables live on its "
            "own device already; use gpu or cpu (where the step counter and loss sums live)",
        )
        _require(
            not towers.jit_compile,
            f"--xla cannot be used with --pipeline_stages ({s}) yet: XLA would compile each stage's pass apart, "
            "which is not built; use S=1 for it",
        )


@dataclasses.dataclass(frozen=True)
class TensorSplit:
    """How each layer is split over the devices of a tower (`models.sharded`, docs/tensor_parallel.md): the model's
    wide layers are cut into `shards` shards (a property of the model: its variables), and a tower is `parallel`
    devices, shard k on device k*parallel//shards. 1 and 1: no split."""

    parallel: int = 1  # T: devices per tower
    shards: int = 1  # N: shards per layer; every T dividing N gives the same bits
    layout: tuple[tuple[str, str], ...] = ()  # (layer-path pattern, how): a model's plan (models.layout)
    shards_set: bool = True  # --tensor_shards given; else `shards` is --tensor_parallel's T

    @property
    def shards_named(self) -> str:
        """The shard count as the flag the user set: "--tensor_shards (4)", or "--tensor_parallel (2)" when
        --tensor_shards is not set and T is the shard count."""
        if self.shards_set:
            return f"--tensor_shards ({self.shards})"
        return f"--tensor_parallel ({self.parallel}, the shard count without --tensor_shards)"

    def check(self, towers, mode_runs_pipelines: bool) -> None:
        """Every rule of --tensor_parallel and --tensor_shards, in one place (`modes.settle` runs it).

        Raises:
          ConfigError: naming the flags and what to change.
        """
        t, n = self.parallel, self.shards
        _require(
            n % t == 0,
            f"--tensor_parallel ({t}) must divide --tensor_shards ({n}): each device of a tower holds whole shards",
        )
        _require(
            towers.num_towers % t == 0,
            f"--tensor_parallel ({t}) must divide --num_gpus ({towers.num_towers}): each task's devices form whole "
            "towers of T devices (a tower never spans machines)",
        )
        if t > 1:
            self._check_options(towers, mode_runs_pipelines)

    def _check_options(self, towers, mode_runs_pipelines: bool) -> None:
        t = self.parallel
        _require(
            mode_runs_pipelines,
            f"--tensor_parallel ({t}) needs --update_mode=sync: the devices of a tower share each micro-batch's "
            "layers, which async towers, one per device, do not",
        )
        _require(
            towers.parameter_device != "spread",
            f"--parameter_device=spread cannot be used with --tensor_parallel ({t}): each shard's variables live on "
            "its own device already; use gpu or cpu (where the other variables live)",
        )
        _require(
            not towers.jit_compile,
            f"--xla cannot be used with --tensor_parallel ({t}): XLA compiles for one device; drop --xla",
        )


LAYOUT_SPLITS = ("column", "row", "heads")  # how --tensor_layout splits a layer (models.layout.SPLITS)


def layout_pairs(entries) -> tuple[tuple[str, str], ...]:
    """--tensor_layout's entries ("PATTERN=column", "PATTERN=row" or "PATTERN=heads") as (pattern, split) pairs.

    Raises:
      ConfigError: an entry of another form, or a pattern that is not a regular expression.
    """
    pairs = []
    for entry in entries:
        pattern, _, how = entry.rpartition("=")
        _require(
            how in LAYOUT_SPLITS and bool(pattern),
            f"entry {entry!r} must be PATTERN=column, PATTERN=row or PATTERN=heads (a layer path's pattern)",
        )
        try:
            re.compile(pattern)
        except re.error as e:
            raise ConfigError(f"entry {entry!r}: {pattern!r} is not a regular expression ({e})") from None
        pairs.append((pattern, how))
    return tuple(pairs)
