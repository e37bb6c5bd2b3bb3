"""TFRecord input for towerflow: schemas, inspection, the tf.data pipelines, writer, the digits data set.

The schema names import at once; the rest loads on first use (PEP 562), because importing TensorFlow takes
seconds and `python -m data.prepare` validates its arguments before that.

When that first use imports TensorFlow, its C++ start-up lines (`cudart_stub`, `cpu_feature_guard`, `oneDNN
custom operations are on`, absl's banner) are kept off stderr: TF_CPP_MIN_LOG_LEVEL is set to 1 (INFO hidden,
warnings and errors shown) unless the environment sets it, and the lines below it written during the import
are dropped (`data.native_log`). A script that imported TensorFlow before `data` keeps what it chose.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from data import native_log
from data.schema import DataError, DenseSchema, Feature, FeatureSchema, ImageSchema, Preprocess, RecordInfo

if TYPE_CHECKING:
    from data.cache import AUTO_CACHE_BYTES, DecodedRecords, estimated_bytes
    from data.check import check_records, find_bad_record
    from data.digits import ensure_digits
    from data.feature_pipeline import feature_eval_dataset, feature_training_dataset
    from data.features import check_feature_records, inspect_feature_records
    from data.inspect import inspect_records, list_files
    from data.integrity import BadRecords
    from data.parse import decoded_images, serving_images
    from data.pipeline import Stream, decode_share, eval_dataset, make_dataset, training_dataset
    from data.writer import write_dense_records, write_feature_records, write_image_records

LIBRARY_LOG_LEVEL = 1  # a script that imports data: TensorFlow's INFO lines hidden, its warnings and errors not

_LAZY = {
    "AUTO_CACHE_BYTES": "data.cache",
    "DecodedRecords": "data.cache",
    "decode_share": "data.pipeline",
    "estimated_bytes": "data.cache",
    "BadRecords": "data.integrity",
    "check_records": "data.check",
    "find_bad_record": "data.check",
    "eval_dataset": "data.pipeline",
    "inspect_records": "data.inspect",
    "make_dataset": "data.pipeline",
    "list_files": "data.inspect",
    "Stream": "data.pipeline",
    "training_dataset": "data.pipeline",
    "write_image_records": "data.writer",
    "write_dense_records": "data.writer",
    "write_feature_records": "data.writer",
    "check_feature_records": "data.features",
    "inspect_feature_records": "data.features",
    "feature_training_dataset": "data.feature_pipeline",
    "feature_eval_dataset": "data.feature_pipeline",
    "ensure_digits": "data.digits",
    "decoded_images": "data.parse",
    "serving_images": "data.parse",
}

__all__ = [
    "AUTO_CACHE_BYTES",
    "DecodedRecords",
    "Preprocess",
    "estimated_bytes",
    "BadRecords",
    "DataError",
    "DenseSchema",
    "Feature",
    "FeatureSchema",
    "ImageSchema",
    "RecordInfo",
    "Stream",
    "check_feature_records",
    "check_records",
    "decode_share",
    "decoded_images",
    "eval_dataset",
    "feature_eval_dataset",
    "feature_training_dataset",
    "ensure_digits",
    "find_bad_record",
    "inspect_feature_records",
    "inspect_records",
    "list_files",
    "make_dataset",
    "serving_images",
    "training_dataset",
    "write_dense_records",
    "write_feature_records",
    "write_image_records",
]


def __getattr__(name: str):
    if name in _LAZY:
        with native_log.quiet_first_import(LIBRARY_LOG_LEVEL):
            module = importlib.import_module(_LAZY[name])
        value = getattr(module, name)
        globals()[name] = value  # later lookups skip __getattr__
        return value
    raise AttributeError(f"module 'data' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
