"""TensorBoard output: scalars, gradient/weight histograms, the run's settings as hparams, and a chart layout.

Tags are stable: a variable's tag comes from its position and its path with Keras's global layer counters
removed (`dense_3/kernel` -> `dense/kernel`), so two runs of the same model write the same tags whatever
else the process built before.

Where things go, and why (read off TensorBoard 2.21's plugins):
- `model_dir/train`, `model_dir/eval`: scalars and histograms, one TensorBoard run each.
- `model_dir` itself: the hparams session and experiment, and the custom-scalars layout. The hparams plugin
  finds a session's metric (group, tag) in the run `<session run>/<group>`, so with the session in
  `model_dir`, `eval/accuracy` is the eval run's `accuracy`. This makes `model_dir` a run too, which is why
  checkpoints live in `model_dir/checkpoints/` (`trainer.outputs.checkpoint_files`).
- The experiment (the HParams table's columns) is the same in every run: TensorBoard shows the one of an
  arbitrary run, so it lists every setting any run may record; a run records only those that apply to it.
"""

from __future__ import annotations

import functools
import os
import re

import tensorflow as tf
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.custom_scalar import summary as custom_scalar_summary
from tensorboard.plugins.histogram import metadata as histogram_metadata
from tensorboard.plugins.hparams import api as hp
from tensorboard.plugins.hparams import plugin_data_pb2

from trainer.settings import config as cfg
from trainer.step.modes import Plan
from trainer.system import graphs

_COUNTER = re.compile(r"_\d+(?=/|$)")
TOWER_CHART_REGEX = r"tower_step_sec/.*"


def variable_tags(variables) -> list[str]:
    """One stable tag per variable: `<index>_<path without layer counters>`."""
    return [f"{i:03d}_{_COUNTER.sub('', v.path)}" for i, v in enumerate(variables)]


def histogram_buckets(values, bucket_count: int = 30):
    """TensorBoard's histogram tensor: [bucket_count, 3] rows of (left edge, right edge, count), all in the
    last bucket when every value is the same; counted with `bincount` instead of a one-hot."""
    values = tf.reshape(tf.cast(values, tf.float64), [-1])
    low, high = tf.reduce_min(values), tf.reduce_max(values)
    width = (high - low) / bucket_count
    index = tf.where(width > 0, tf.floor((values - low) / tf.where(width > 0, width, 1.0)), bucket_count - 1)
    index = tf.minimum(tf.cast(index, tf.int32), bucket_count - 1)
    counts = tf.math.bincount(index, minlength=bucket_count, maxlength=bucket_count, dtype=tf.float64)
    edges = tf.concat([tf.linspace(low, high, bucket_count + 1)[:-1], [high]], 0)
    left = tf.where(width > 0, edges[:-1], tf.fill([bucket_count], high))
    right = tf.where(width > 0, edges[1:], tf.fill([bucket_count], high))
    return tf.transpose(tf.stack([left, right, counts]))


def _histogram(tag: str, values) -> None:
    metadata = histogram_metadata.create_summary_metadata(display_name=None, description="")
    tf.summary.write(tag, histogram_buckets(values), metadata=metadata)


class Summaries:
    """Event writers for `model_dir/train`, `model_dir/eval` and (hparams, layout) `model_dir`."""

    def __init__(self, model_dir: str, tower_tags: list[str] | None = None):
        self.tower_tags = tower_tags  # names of the per-tower scalars; None: tower_<i>
        self.run = tf.summary.create_file_writer(model_dir)
        self.train = tf.summary.create_file_writer(os.path.join(model_dir, "train"))
        self._histogram_fns: dict = {}  # graph-built histogram writers, one per list of tags
        self.eval = tf.summary.create_file_writer(os.path.join(model_dir, "eval"))

    def scalars(self, split: str, step: int, values: dict) -> None:
        """Writes each float in `values` (nested one level for per-tower lists) as a scalar."""
        writer = self.train if split == "train" else self.eval
        with writer.as_default(step=step):
            for name, value in values.items():
                if isinstance(value, (list, tuple)):
                    for i, item in enumerate(value):
                        tag = self.tower_tags[i] if self.tower_tags else f"tower_{i}"
                        tf.summary.scalar(f"{name}/{tag}", item)
                else:
                    tf.summary.scalar(name, value)
        writer.flush()

    def histograms(self, step: int, tags: list[str], gradients, variables) -> None:
        """Writes `gradients/<tag>` (averaged over micro-batches) and `weights/<tag>` histograms.

        One graph call per histogram step, buckets counted with `bincount` on the host CPU (deterministic on
        every device): TensorBoard's eager `tf.summary.histogram` costs hundreds of small eager ops and a
        [size x 30] float64 one-hot per tensor (about 9 step times of the cnn per histogram step, against
        about 1 for this)."""
        key = tuple(tags)
        if key not in self._histogram_fns:
            self._histogram_fns[key] = graphs.function(functools.partial(self._write_histograms, key))
        self._histogram_fns[key](tf.constant(step, tf.int64), list(gradients), list(variables))

    def _write_histograms(self, tags, step, gradients, variables) -> None:
        with self.train.as_default(step=step), tf.device("/device:CPU:0"):
            for tag, grad, variable in zip(tags, gradients, variables, strict=True):
                _histogram(f"gradients/{tag}", grad)
                _histogram(f"weights/{tag}", variable)

    def staleness(self, step: int, values) -> None:
        """Async: the histogram of the staleness of the updates of a window."""
        with self.train.as_default(step=step):
            tf.summary.histogram("staleness", tf.constant(values, tf.float32))

    def hparams(self, plan: Plan, model: str, metric_names: tuple[str, ...] = ("accuracy",)) -> None:
        """Records, in `model_dir`, the experiment (hparam and metric columns), the settings of the run `plan`
        settled and the `model` its task built (`run_hparams`), the task's metrics (`metric_names`: eval's
        first, then train's, each beside its loss) and the custom-scalars layout that charts every tower's step
        time together. Called once per start; `trainer.outputs.event_files.purge_events` drops the previous
        start's records."""
        with self.run.as_default(step=0):
            tf.summary.experimental.write_raw_pb(_experiment(metric_names).SerializeToString(), step=0)
            # The trial ID column shows the model_dir's name, not a hash of the settings.
            trial_id = os.path.basename(os.path.normpath(plan.config.loop.model_dir))
            hp.hparams(run_hparams(plan, model), trial_id=trial_id)
            tf.summary.experimental.write_raw_pb(custom_scalar_summary.pb(_layout()).SerializeToString(), step=0)
        self.run.flush()

    def close(self) -> None:
        self.train.close()
        self.eval.close()
        self.run.close()


def run_hparams(plan: Plan, model: str) -> dict:
    """The settings that define the run, resolved (K micro-batches, not the 0 that means one per tower;
    towers of every task; `float32` for no mixed precision), and the current `--train_steps`. Settings that
    do not apply to the run (momentum of adam, staleness bound of sync) are left out, not recorded as None;
    the update mode adds its own (`UpdateMode.hparams`). `model`: the model the task built, as the task
    describes it (`Task.model_description`), not `--model`, which only some tasks read."""
    config = plan.config
    t, o = config.towers, config.optimizer
    values = {
        "model": model,
        "optimizer": o.name,
        "learning_rate": o.learning_rate,
        "lr_schedule": o.schedule,
        "warmup_steps": o.warmup_steps,
        "clip_global_norm": o.clip_global_norm,
        "global_batch_size": t.global_batch_size,
        "micro_batches": t.num_micro_batches,
        "micro_batch_size": t.micro_batch_size,
        "towers": t.total_towers,
        "num_tasks": t.num_tasks,
        "update_mode": t.update_mode,
        "precision": t.mixed_precision or "float32",
        # "gpu" means the first tower's device, a CPU with --device=cpu
        "parameter_device": t.device if t.parameter_device == "gpu" else t.parameter_device,
        "xla": t.jit_compile,
        "deterministic": config.deterministic,
        "seed": config.seed,
        "train_steps": config.loop.train_steps,
    }
    if o.name == "momentum":
        values["momentum"] = o.momentum
    if o.name == "adamw":
        values["weight_decay"] = o.weight_decay
    if o.schedule == "piecewise":
        values["lr_boundaries"] = ",".join(str(b) for b in o.boundaries)
        values["lr_values"] = ",".join(str(v) for v in o.values)
    values.update(plan.mode.hparams(config))
    return values


def _hparam(name: str, description: str, choices=None) -> hp.HParam:
    # A domain only where it holds every value any run can record: TensorBoard shows one run's experiment
    # for all, and a domain of that run's own values would filter the other runs out.
    return hp.HParam(name, hp.Discrete(list(choices)) if choices else None, description=description)


EXPERIMENT_HPARAMS = [
    _hparam("model", "the model the task built (its model_description: --model's, or the task's own)"),
    _hparam("optimizer", "--optimizer", cfg.OPTIMIZERS),
    _hparam("learning_rate", "--learning_rate (peak, before the schedule)"),
    _hparam("lr_schedule", "--lr_schedule", cfg.SCHEDULES),
    _hparam("warmup_steps", "--warmup_steps"),
    _hparam("lr_boundaries", "--lr_boundaries (piecewise)"),
    _hparam("lr_values", "--lr_values (piecewise)"),
    _hparam("momentum", "--momentum (momentum optimizer)"),
    _hparam("weight_decay", "--weight_decay (adamw)"),
    _hparam("clip_global_norm", "--clip_global_norm (0: none)"),
    _hparam("global_batch_size", "--global_batch_size: examples per step"),
    _hparam("micro_batches", "K, resolved: --micro_batches, or one per tower"),
    _hparam("micro_batch_size", "examples per micro-batch: global batch / K"),
    _hparam("towers", "towers of the whole run: --num_gpus x tasks"),
    _hparam("num_tasks", "machines (tasks) of the run"),
    _hparam("update_mode", "--update_mode", cfg.UPDATE_MODES),
    _hparam("max_staleness", "--max_staleness (async; negative: unbounded)"),
    _hparam("precision", "--mixed_precision", ("float32", *cfg.MIXED_PRECISION[1:])),
    _hparam("parameter_device", "--parameter_device", cfg.PARAMETER_DEVICES),
    _hparam("xla", "--xla", (False, True)),
    _hparam("deterministic", "--deterministic", (False, True)),
    _hparam("seed", "--seed"),
    _hparam("train_steps", "--train_steps: the run's current target"),
]
# Shown in the HParams table at first (it shows 5, settings marked `differs` first; the user ticks others).
HEADLINE_HPARAMS = ("model", "optimizer", "learning_rate", "global_batch_size", "micro_batches")


def experiment_metrics(metric_names: tuple[str, ...]) -> list:
    """The HParams metric columns: per group (eval, then train) each task metric, then the loss."""
    kinds = (("eval", hp.Metric.VALIDATION), ("train", hp.Metric.TRAINING))
    return [
        hp.Metric(name, group=group, display_name=f"{group} {name}", dataset_type=kind)
        for group, kind in kinds
        for name in (*metric_names, "loss")
    ]


def _experiment(metric_names: tuple[str, ...]):
    """The experiment summary, with the headline settings marked `differs`: a run cannot know which settings
    differ between the runs of a logdir, and TensorBoard displays those marked first."""
    summary = hp.hparams_config_pb(hparams=EXPERIMENT_HPARAMS, metrics=experiment_metrics(metric_names))
    plugin_data = summary.value[0].metadata.plugin_data
    content = plugin_data_pb2.HParamsPluginData.FromString(plugin_data.content)
    for info in content.experiment.hparam_infos:
        info.differs = info.name in HEADLINE_HPARAMS
    plugin_data.content = content.SerializeToString()
    return summary


def _layout() -> layout_pb2.Layout:
    """Custom Scalars: one chart with a line per tower (TensorBoard's Scalars tab gives each tag its own card)."""
    chart = layout_pb2.Chart(
        title="tower_step_sec: seconds per step of each tower",
        multiline=layout_pb2.MultilineChartContent(tag=[TOWER_CHART_REGEX]),
    )
    return layout_pb2.Layout(category=[layout_pb2.Category(title="towers", chart=[chart])])
