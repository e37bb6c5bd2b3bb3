"""What training does to the data, resolved: `--augment=auto` by model family (`resolve_augment`, applied once
by `trainer.settings.resolve`), and `DataSettings`, what the records then decide (the cache; normalization per
channel), built once per run by `trainer.loop.inputs.data_settings` and read by the train and eval pipelines,
the export, the banner and metrics.json. Imports no TensorFlow.
"""

from __future__ import annotations

import dataclasses

from data.schema import Preprocess

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
    """What training reads, resolved (`trainer.loop.inputs.data_settings` decides it from the flags and records).

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


def format_bytes(count: int) -> str:
    """~3 MB, ~150 MB, ~1.2 GB: the order of magnitude an estimate is worth."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if count >= size:
            value = count / size
            return f"~{value:.1f} {unit}" if value < 10 else f"~{value:.0f} {unit}"
    return f"~{count} bytes"
