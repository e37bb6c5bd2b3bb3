"""How a run reads its task's records: one reader per kind of records, which the task chooses
(`tasks.Task.records`), once in `build`. A kind is what the records hold, not a task: any task may pick either.

- `LabeledRecords` ("labeled"): images and dense vectors, each with a class label, through the built-in
  pipeline (`data.pipeline`): schema auto-detection, decoding, augmentation, normalization, the decoded
  cache, the digits by default, and the serving signatures of a model of class logits, which repeat eval's
  preprocessing (`trainer.outputs.serving_labeled`). The task is told what the records hold (`task.bind`).
- `FeatureRecords` ("features"): a task's own records, read by its `features()` and `preprocess`
  (`data.feature_training_dataset`), variable-length features padded per batch; its own `serving`.

Both give the engine the same things: the inspected records (`Inputs`), the eval check, the data settings,
a training stream per micro-batch index that yields (batch, position), the eval dataset, the export's
signatures and the banner's data lines.
"""

from __future__ import annotations

import data
from trainer.loop.inputs import Inputs, resolve_inputs
from trainer.loop.lookups import explain_lookup
from trainer.outputs.export import TaskServing
from trainer.outputs.serving_labeled import Serving as LabeledServing
from trainer.settings.config import RunConfig
from trainer.settings.preprocess import DataSettings, data_settings
from trainer.step.memory import estimate as footprint


class LabeledRecords:
    """Images and dense vectors with class labels. The task that picks them has `bind(example_shape,
    num_classes)` and a model of class logits (the signatures' outputs)."""

    position_size = 2  # a stream's position: (epoch, record)
    padded_length = 1  # images and vectors have no variable length
    longest_length = 1

    def __init__(self, task, config: RunConfig):
        self.task, self.config = task, config

    def resolve(self) -> Inputs:
        """Finds and inspects the records (the digits without --train_data); tells the task their shape.

        Raises:
          data.DataError: no records, unreadable records, --group_by_length (images and vectors have no length),
            own records without --num_classes.
        """
        d = self.config.data
        if d.group_by_length:
            raise data.DataError(
                f"--group_by_length is for a task's variable-length records, not --task={self.config.task.name}'s "
                "images and vectors"
            )
        if d.train_data and d.num_classes < 2:  # the built-in task refuses it before TensorFlow already
            raise data.DataError(f"--num_classes ({d.num_classes}) must be given (>= 2) with --train_data")
        inputs = resolve_inputs(self.config.data)
        self.task.bind(inputs.train.example_shape, inputs.num_classes)
        return inputs

    def check_eval(self, inputs: Inputs) -> int:
        """Reads every eval record once; returns how many there are."""
        # Every eval record once (CRCs, keys, labels; not the image decode, 8x slower): a bad eval file fails
        # now, not after training. 0.3 s for 50,000 32x32 records on 2 cores.
        return data.check_records(inputs.eval, inputs.num_classes, what="--eval_data")

    def data_settings(self, inputs: Inputs) -> DataSettings:
        return data_settings(self.config, inputs.train)

    def check_fits(self, model, inputs: Inputs) -> None:
        footprint.check_batch_fits(model, self.config, inputs.train.example_shape)

    def stream(self, inputs: Inputs, stream: data.Stream, decoded):
        """position -> stream j's dataset of ((features, labels), position after the batch)."""

        def make(position):
            dataset = data.training_dataset(inputs.train, stream, resume_from=position, cache=decoded)
            return dataset.map(lambda features, labels, after: ((features, labels), after))

        return make

    def stream_settings(self, inputs: Inputs, settings: DataSettings) -> dict:
        """What `data.Stream` takes beyond the share: labels checked, images preprocessed."""
        return {"num_classes": inputs.num_classes, "preprocess": settings.preprocess}

    def decode_share(self, inputs: Inputs, settings: DataSettings, share: dict):
        """The stream's records decoded once (`--cache=memory`), or None."""
        return data.decode_share(inputs.train, **share, num_classes=inputs.num_classes) if settings.cache else None

    def eval_dataset(self, inputs: Inputs, stream: data.Stream):
        return data.eval_dataset(inputs.eval, stream)

    def serving(self, inputs: Inputs, settings: DataSettings):
        return LabeledServing(inputs.train, inputs.num_classes, settings.preprocess)

    def explain_failure(self, error: BaseException, what: str):
        """What a step's (or eval's) error says about the data, as a DataError, or None: nothing here."""
        del error, what

    def banner_lines(self, inputs: Inputs, settings: DataSettings) -> list[str]:
        shape = "x".join(str(d) for d in inputs.train.example_shape)
        return [
            f"{shape} examples, {inputs.num_classes} classes",
            f"augment    {settings.describe(self.config.model.name)}",
        ]


class FeatureRecords:
    """A task's own records (`tasks.Task.features`, `preprocess`)."""

    def __init__(self, task, config: RunConfig):
        self.task, self.config = task, config
        self.schema = data.FeatureSchema.of(task.features(), task.name)
        self.group_batches = config.data.group_by_length
        # A stream's position: (epoch, record), and with length grouping the batches done in the pool.
        self.position_size = 3 if self.group_batches > 1 else 2
        # The shortest length a padded batch has: its variable-length features' smallest bucket.
        self.padded_length = min((f.buckets[0] for _, f in self.schema.features if f.variable), default=1)
        # The longest: what a step's memory is counted at (`trainer.step.memory.device_memory`).
        self.longest_length = max((f.buckets[-1] for _, f in self.schema.features if f.variable), default=1)

    def resolve(self) -> Inputs:
        """The --train_data / --eval_data records, or the task's default data; each file's first record is
        checked against the task's features.

        Raises:
          data.DataError: no records given and the task has no default; a file that does not match.
        """
        patterns = (self.config.data.train_data, self.config.data.eval_data)
        if not patterns[0]:
            patterns = self.task.default_data()
            if patterns is None:
                raise data.DataError(f"--task={self.config.task.name} has no built-in data: pass --train_data")
        if self.group_batches and not any(f.variable for _, f in self.schema.features):
            raise data.DataError(f"--group_by_length: task {self.task.name!r} has no variable-length feature")
        train = data.inspect_feature_records(patterns[0], self.schema, what="--train_data")
        evaluation = data.inspect_feature_records(patterns[1], self.schema, what="--eval_data")
        return Inputs(train, evaluation, 0)

    def check_eval(self, inputs: Inputs) -> int:
        """Reads every eval record once; returns how many there are."""
        return data.check_feature_records(inputs.eval, what="--eval_data")

    def data_settings(self, inputs: Inputs) -> DataSettings:
        del inputs
        return DataSettings(cache_reason="a task's records are not cached")

    def check_fits(self, model, inputs: Inputs) -> None:
        """Not estimated for a task's records (the footprint estimate knows image and vector inputs)."""

    def stream(self, inputs: Inputs, stream: data.Stream, decoded):
        del decoded

        def make(position):
            return data.feature_training_dataset(
                inputs.train, stream, self.task.preprocess, resume_from=position, group_batches=self.group_batches
            )

        return make

    def stream_settings(self, inputs: Inputs, settings: DataSettings) -> dict:
        return {}

    def decode_share(self, inputs: Inputs, settings: DataSettings, share: dict):
        return None

    def eval_dataset(self, inputs: Inputs, stream: data.Stream):
        return data.feature_eval_dataset(inputs.eval, stream, self.task.preprocess)

    def serving(self, inputs: Inputs, settings: DataSettings):
        return TaskServing(self.task)

    def explain_failure(self, error: BaseException, what: str):
        """A DataError for a lookup of the model that failed on an index from the data
        (`trainer.loop.lookups`), or None."""
        return explain_lookup(error, self.schema, what)

    def banner_lines(self, inputs: Inputs, settings: DataSettings) -> list[str]:
        features = ", ".join(f"{key} ({_feature(f)})" for key, f in self.schema.features)
        return [f"records of {features}"]


def _feature(feature: data.Feature) -> str:
    if feature.variable:
        return f"{feature.dtype}, up to {feature.max_length}, padded to {list(feature.buckets)}"
    return f"{feature.dtype} {list(feature.shape)}"


READERS = {"labeled": LabeledRecords, "features": FeatureRecords}


def reader_for(task, config: RunConfig):
    """The reader of `task`'s records (`READERS[task.records]`)."""
    try:
        return READERS[task.records](task, config)
    except KeyError:
        raise data.DataError(f"task {task.name!r}: records {task.records!r} is not one of {sorted(READERS)}") from None
