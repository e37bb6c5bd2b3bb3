"""``cnn``: a small two-conv network for small images (8x8x1 digits up to 32x32x3)."""

import keras
from keras import layers

from models.common import NamedDropout, require_image_shape
from models.registry import register


def _conv_bn_relu(x, filters: int, name: str):
    # No bias: the BatchNorm right after it has its own shift (beta), a conv bias would be dead weight.
    x = layers.Conv2D(filters, 3, padding="same", use_bias=False, data_format="channels_last", name=f"conv{name}")(x)
    x = layers.BatchNormalization(name=f"bn{name}")(x)
    return layers.ReLU(name=f"relu{name}")(x)


@register("cnn")
def cnn(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
    """Conv32-BN-relu, Conv64-BN-relu, MaxPool 2, Dropout .25, Dense 128 relu, Dropout .5, logits.

    Needs a channels-last image shape (H, W, C) with H, W >= 2 (one 2x2 max-pool).
    """
    require_image_shape("cnn", input_shape, min_size=2)
    inputs = keras.Input(shape=input_shape, name="inputs")
    x = _conv_bn_relu(inputs, 32, "1")
    x = _conv_bn_relu(x, 64, "2")
    x = layers.MaxPooling2D(2, data_format="channels_last", name="pool")(x)
    x = NamedDropout(0.25, name="dropout1")(x)
    x = layers.Flatten(name="flatten")(x)
    x = layers.Dense(128, activation="relu", name="dense1")(x)
    x = NamedDropout(0.5, name="dropout2")(x)
    logits = layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inputs, logits, name="cnn")
