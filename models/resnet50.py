"""``resnet50``: ``keras.applications.ResNet50`` with random weights and a logits head.

The Keras implementation names every layer explicitly (``conv1_conv``, ``conv2_block1_1_bn``, ...,
``predictions``); the only auto-named layer it would create is its Input, so we pass our own.
"""

import warnings

import keras

from models.common import require_image_shape
from models.registry import ModelError, register

# Five stride-2 reductions (conv1, pool1, conv3..5); Keras refuses anything smaller.
_MIN_SIZE = 32


@register("resnet50")
def resnet50(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
    """ResNet-50 (He et al. 2015) for channels-last images of at least 32x32; never loads weights."""
    require_image_shape("resnet50", input_shape, min_size=_MIN_SIZE)
    if keras.config.image_data_format() != "channels_last":
        # keras.applications reads the global format; our (H, W, C) shape would be read as (C, H, W).
        raise ModelError(
            "model 'resnet50' needs keras.config.image_data_format() == 'channels_last'; "
            f"it is {keras.config.image_data_format()!r}"
        )
    inputs = keras.Input(shape=input_shape, name="inputs")
    with warnings.catch_warnings():
        # With weights=None any channel count is fine; Keras still warns when it is not 1 or 3.
        warnings.filterwarnings("ignore", message="This model usually expects 1 or 3 input channels")
        return keras.applications.ResNet50(
            weights=None,
            include_top=True,
            input_tensor=inputs,
            input_shape=input_shape,
            classes=num_classes,
            classifier_activation=None,
            name="resnet50",
        )
