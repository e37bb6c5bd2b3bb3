"""What training does to the data, decided here and nowhere else: `--augment=auto` by model family
(`resolve_augment`, applied once by `trainer.settings.resolve`), and `DataSettings`, what the records then
decide (the cache; normalization per channel; augmentation of dense records), made once per run by
`data_settings` (called by `trainer.loop.build.build` once the records are found) and read, as the object
`build` carries in its `Trainer`, by the train and eval pipelines, the export, the banner and metrics.json.
Imports no TensorFlow (`data.estimated_bytes`, which does, is imported when a run's cache is decided).
"""

from __future__ import annotations

import dataclasses

import data
from data.schema import Preprocess
from trainer.settings.config import ConfigError, DataConfig, RunConfig

# --augment=auto by model family: the CIFAR recipe for resnet20, the ImageNet one for resnet50. Everything else
# (mlp and cnn on the digits, whose flipped 2s and 5s are other digits; a module:function model) gets none.
AUTO_AUGMENT = {"resnet20": "crop_flip", "resnet50": "imagenet"}


def resolve_augment(augment: str, model_name: str, dense: bool) -> str:
    """--augment with auto resolved for `model_name`: none for dense records (a float vector has no pixels to
    flip). resnet20 and resnet50, the only models auto augments, refuse dense records, so for a run that
    trains, `dense` can come from --record_schema alone, before any record is read."""
    if augment != "auto":
        return augment
    return "none" if dense else AUTO_AUGMENT.get(model_name, "none")


@dataclasses.dataclass(frozen=True)
class DataSettings:
    """What training reads, resolved (`data_settings` decides it from the flags and the records).

    Attributes:
      preprocess: what the pipeline does to each image (augment; normalization per channel).
      augment_auto: `augment` was chosen by --augment=auto.
      normalize: the --normalize text (`Normalization.text`).
      cache: training images are decoded once into memory.
      cache_reason: why --cache=auto decided `cache` ("~3 MB decoded", "dense records"); "" when --cache
        said it.
      decoded_bytes: the estimate --cache=auto decided on, or None.
    """

    preprocess: Preprocess = Preprocess()
    augment_auto: bool = False
    normalize: str = "none"
    cache: bool = False
    cache_reason: str = ""
    decoded_bytes: int | None = None

    @property
    def augment(self) -> str:
        """none, flip, crop_flip or imagenet."""
        return self.preprocess.augment

    def describe(self, model_name: str) -> str:
        """The banner's text: `crop_flip (auto for resnet20), normalize none, cache memory (auto: ~3 MB
        decoded)`."""
        augment = self.augment + (f" (auto for {model_name})" if self.augment_auto else "")
        cache = "memory" if self.cache else "none"
        if self.cache_reason:
            cache += f" (auto: {self.cache_reason})"
        return f"{augment}, normalize {self.normalize}, cache {cache}"

    def metrics(self) -> dict:
        """The metrics.json entries: what the run trained on."""
        return {
            "augment": self.augment,
            "normalize": self.normalize,
            "cache": "memory" if self.cache else "none",
            "cache_decoded_bytes": self.decoded_bytes,
        }


def data_settings(config: RunConfig, records: data.RecordInfo) -> DataSettings:
    """What training reads, decided once per run from the settled `config` and the training `records`: the
    pipelines, the export, the banner and metrics.json all read the result.

    Raises:
      ConfigError: as `preprocessing`.
    """
    preprocess = preprocessing(config, records)
    cache, reason, decoded = _cache_decision(config.data, records)
    return DataSettings(preprocess, config.data.augment_auto, config.data.normalize.text, cache, reason, decoded)


def preprocessing(config: RunConfig, records: data.RecordInfo) -> Preprocess:
    """The resolved --augment and the --normalize of `config`, checked against the training records.

    Raises:
      ConfigError: augmentation or normalization asked of dense records, or normalization values for
        another number of channels than the images have.
    """
    augment, norm = config.data.augment, config.data.normalize
    if isinstance(records.schema, data.DenseSchema):
        if config.data.augment_auto:  # --record_schema=auto: only the records said they are dense
            augment = "none"
        if augment != "none" or norm:
            flag = f"--augment={augment}" if augment != "none" else f"--normalize={norm.text}"
            raise ConfigError(
                f"{flag} applies to images, but --train_data holds dense records (a float vector per example); "
                "pass --augment=none --normalize=none, or normalize the vectors when writing them"
            )
        return Preprocess(augment)
    if not norm:
        return Preprocess(augment)
    return Preprocess(augment, *norm.per_channel(records.example_shape[-1]))


def use_cache(config: DataConfig, records: data.RecordInfo) -> bool:
    """Whether training images are decoded once into memory: --cache=memory, or auto below the bound."""
    return _cache_decision(config, records)[0]


def _cache_decision(config: DataConfig, records: data.RecordInfo) -> tuple[bool, str, int | None]:
    """(cache or not, why auto decided so or "", the decoded-size estimate auto decided on or None)."""
    if isinstance(records.schema, data.DenseSchema):
        return False, "dense records" if config.cache == "auto" else "", None
    if config.cache != "auto":
        return config.cache == "memory", "", None
    decoded = data.estimated_bytes(records)
    bound = "" if decoded <= data.AUTO_CACHE_BYTES else f", over the {data.AUTO_CACHE_BYTES / 2**30:g} GiB bound"
    return decoded <= data.AUTO_CACHE_BYTES, f"{format_bytes(decoded)} decoded{bound}", decoded


def format_bytes(count: int) -> str:
    """~3 MB, ~150 MB, ~1.2 GB: the order of magnitude an estimate is worth."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if count >= size:
            value = count / size
            return f"~{value:.1f} {unit}" if value < 10 else f"~{value:.0f} {unit}"
    return f"~{count} bytes"
