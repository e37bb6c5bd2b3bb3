"""The signatures of a model of class logits over labeled images or vectors (`trainer.loop.records`'s
`LabeledRecords`, whichever task reads them): each does in-graph what the eval input pipeline does, with the run's
own resolved preprocessing (the `data.Preprocess` object eval uses: `trainer.settings.preprocess.DataSettings`),
so a client never has to guess: `serving_default` decodes encoded images (`data.serving_images`);
`predict_uint8` takes images decoded at (H, W), `predict_float` the same divided by 255
(`data.decoded_images`). Each then does what eval does after its decoder, with eval's own loader: the central
87.5% crop under --augment=imagenet, bilinear resizing to (H, W) (the identity for an (H, W) image without a
crop), / 255, --normalize. Every signature returns `logits`, `probabilities` (softmax) and `classes` (argmax,
int64), float32 even under mixed precision. Dense records get `predict_float` (also `serving_default`) only.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

import data
from data.augment import EVAL_CROP_FRACTION
from trainer.settings.config import RunConfig

OUTPUT_NAMES = ("logits", "probabilities", "classes")


@dataclasses.dataclass(frozen=True)
class Serving:
    """What the signatures take: the training records' schema and example shape, the number of classes, and the
    preprocessing eval applies (the same object)."""

    train: data.RecordInfo
    num_classes: int
    preprocess: data.Preprocess

    def check(self, model: keras.Model) -> None:
        """Every classification model has its signatures."""

    def archive(self, model: keras.Model) -> keras.export.ExportArchive:
        return _archive(model, self)

    def signature_names(self) -> list[str]:
        return _signature_names(self)

    def contract(self, config: RunConfig, step: int) -> dict:
        return contract(config, self, step)


def _signature_names(inputs: Serving) -> list[str]:
    if _is_dense(inputs):
        return ["serving_default", "predict_float"]
    return ["serving_default", "predict_uint8", "predict_float"]


def _is_dense(inputs: Serving) -> bool:
    return isinstance(inputs.train.schema, data.DenseSchema)


def _archive(model: keras.Model, inputs: Serving) -> keras.export.ExportArchive:
    """An ExportArchive holding `model` with one endpoint per signature (the first is also serving_default)."""
    archive = keras.export.ExportArchive()
    archive.track(model)
    shape = inputs.train.example_shape

    def outputs(features: tf.Tensor) -> dict:
        logits = tf.cast(model(features, training=False), tf.float32)  # mixed precision computes in 16 bits
        return {
            "logits": logits,
            "probabilities": tf.nn.softmax(logits, axis=-1),
            "classes": tf.argmax(logits, axis=-1, output_type=tf.int64),
        }

    if _is_dense(inputs):  # dense records are float32 features as stored, unscaled (data.parse)
        features = tf.TensorSpec([None, *shape], tf.float32, name="features")
        archive.add_endpoint("predict_float", lambda features: outputs(features), [features])
        return archive
    images_float = tf.TensorSpec([None, *shape], tf.float32, name="images")
    images_uint8 = tf.TensorSpec([None, *shape], tf.uint8, name="images")
    image_bytes = tf.TensorSpec([None], tf.string, name="image_bytes")
    decode = data.serving_images(inputs.train, inputs.preprocess)
    from_uint8 = data.decoded_images(inputs.train, inputs.preprocess)
    from_float = data.decoded_images(inputs.train, inputs.preprocess, scale=255.0)
    archive.add_endpoint("serving_default", lambda image_bytes: outputs(decode(image_bytes)), [image_bytes])
    archive.add_endpoint("predict_uint8", lambda images: outputs(from_uint8(images)), [images_uint8])
    archive.add_endpoint("predict_float", lambda images: outputs(from_float(images)), [images_float])
    return archive


def contract(config: RunConfig, inputs: Serving, step: int) -> dict:
    """What `assets.extra/towerflow_serving.json` says: each signature's input, the outputs, the labels."""
    num_classes = inputs.num_classes
    return {
        "model": config.model.name,
        "global_step": step,
        "schema": "dense" if _is_dense(inputs) else "image",
        "num_classes": num_classes,
        "label_offset": inputs.train.schema.label_offset,
        "labels": "class k is the records' label k + label_offset",
        "mixed_precision": config.towers.mixed_precision or "none",
        "preprocessing": _preprocessing(inputs.preprocess),
        "signatures": _signature_inputs(inputs),
        "outputs": {
            "logits": {"dtype": "float32", "shape": [None, num_classes]},
            "probabilities": {"dtype": "float32", "shape": [None, num_classes], "what": "softmax(logits)"},
            "classes": {"dtype": "int64", "shape": [None], "what": "argmax(logits)"},
        },
    }


def _signature_inputs(inputs: Serving) -> dict:
    """signature name -> {input name -> dtype, shape, range, layout, what is done to it}: `_archive`, as data."""
    shape = list(inputs.train.example_shape)
    if _is_dense(inputs):
        features = {"features": {"dtype": "float32", "shape": [None, *shape], "range": "as stored in the records"}}
        return {"serving_default": features, "predict_float": features}
    height, width, channels = shape
    after = _eval_steps(inputs.preprocess, height, width, at_size=False)
    at_size = _eval_steps(inputs.preprocess, height, width, at_size=True)
    image_bytes = {
        "dtype": "string",
        "shape": [None],
        "content": "encoded JPEG, PNG, BMP, GIF or WebP (first frame of an animation), any size",
        "in_graph": f"decoded to {channels} channel(s), {after}",
    }
    images = {"shape": [None, *shape], "layout": "NHWC"}
    return {
        "serving_default": {"image_bytes": image_bytes},
        "predict_uint8": {
            "images": {
                "dtype": "uint8",
                **images,
                "range": [0, 255],
                "content": f"decoded pixels at {height}x{width}",
                "in_graph": f"cast to float32, {at_size}",
            }
        },
        "predict_float": {
            "images": {
                "dtype": "float32",
                **images,
                "range": [0.0, 1.0],
                "scaling": "pixel / 255",
                "content": f"decoded pixels at {height}x{width}, divided by 255",
                "in_graph": f"multiplied by 255 (exact for pixel / 255), {at_size}",
            }
        },
    }


def _eval_steps(preprocess: data.Preprocess, height: int, width: int, at_size: bool) -> str:
    """What an image signature does after its input is pixels in [0, 255], in words: eval's steps. at_size:
    the input is at (H, W) already, where resizing without a crop is the identity."""
    crop = f"the central {EVAL_CROP_FRACTION:.1%} of each side taken (eval's crop), " if _crops(preprocess) else ""
    resize = f"resized bilinear to {height}x{width}" + (" (the identity)" if at_size and not crop else "")
    norm = "normalized (x - mean) / std as `preprocessing` says" if preprocess.mean is not None else "not normalized"
    return f"{crop}{resize}, scaled by 1/255, {norm}: what eval does to the records"


def _crops(preprocess: data.Preprocess) -> bool:
    return preprocess.augment == "imagenet"


def _preprocessing(preprocess: data.Preprocess) -> dict:
    """What every image signature applies after its input is pixels in [0, 255]: eval's, of this run."""
    normalize = None
    if preprocess.mean is not None:
        normalize = {"mean": list(preprocess.mean), "std": list(preprocess.std), "what": "(x - mean) / std"}
    steps = ["eval_crop"] if _crops(preprocess) else []
    steps += ["resize_bilinear", "scale_1/255"] + (["normalize"] if normalize else [])
    return {
        "augment": preprocess.augment,
        "eval_crop": _crops(preprocess),
        "eval_crop_fraction": EVAL_CROP_FRACTION if _crops(preprocess) else None,
        "normalize": normalize,
        "steps": steps,
        "applies_to": "every signature, after its input is read as pixels in [0, 255] at the model's (H, W) "
        "(serving_default: decoded, any size)",
    }
