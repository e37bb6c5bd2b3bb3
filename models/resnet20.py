"""``resnet20``: the CIFAR ResNet v1 of He et al. 2015 (arXiv:1512.03385, section 4.2), n = 3.

3x3 conv 16, then three stages of three basic blocks with 16, 32 and 64 filters; the first block of
stages 2 and 3 halves the resolution with stride 2 and uses a 1x1 conv + BN projection shortcut (the
paper's option B; its CIFAR runs used zero-padding, option A). Global average pool, dense logits.
"""

import keras
from keras import layers

from models.common import require_image_shape
from models.registry import register

_STAGE_FILTERS = (16, 32, 64)
_BLOCKS_PER_STAGE = 3
_WEIGHT_DECAY = 1e-4


def _conv(x, filters: int, kernel_size: int, strides: int, name: str):
    # He init and L2 on every kernel as in the paper; the trainer adds model.losses to the loss.
    return layers.Conv2D(
        filters,
        kernel_size,
        strides=strides,
        padding="same",
        use_bias=False,
        kernel_initializer="he_normal",
        kernel_regularizer=keras.regularizers.L2(_WEIGHT_DECAY),
        data_format="channels_last",
        name=name,
    )(x)


def _basic_block(x, filters: int, strides: int, name: str):
    """Two 3x3 conv-BN with relu between, plus the shortcut, then relu."""
    shortcut = x
    if strides != 1 or x.shape[-1] != filters:
        shortcut = _conv(x, filters, 1, strides, f"{name}_proj_conv")
        shortcut = layers.BatchNormalization(name=f"{name}_proj_bn")(shortcut)
    x = _conv(x, filters, 3, strides, f"{name}_conv1")
    x = layers.BatchNormalization(name=f"{name}_bn1")(x)
    x = layers.ReLU(name=f"{name}_relu1")(x)
    x = _conv(x, filters, 3, 1, f"{name}_conv2")
    x = layers.BatchNormalization(name=f"{name}_bn2")(x)
    x = layers.Add(name=f"{name}_add")([shortcut, x])
    return layers.ReLU(name=f"{name}_out")(x)


@register("resnet20")
def resnet20(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
    """ResNet-20 for channels-last images (H, W, C) of any small size (8x8x1 and 32x32x3 are tested)."""
    require_image_shape("resnet20", input_shape)
    inputs = keras.Input(shape=input_shape, name="inputs")
    x = _conv(inputs, _STAGE_FILTERS[0], 3, 1, "conv1")
    x = layers.BatchNormalization(name="bn1")(x)
    x = layers.ReLU(name="relu1")(x)
    for stage, filters in enumerate(_STAGE_FILTERS, start=1):
        for block in range(1, _BLOCKS_PER_STAGE + 1):
            strides = 2 if stage > 1 and block == 1 else 1
            x = _basic_block(x, filters, strides, name=f"stage{stage}_block{block}")
    x = layers.GlobalAveragePooling2D(data_format="channels_last", name="avg_pool")(x)
    logits = layers.Dense(
        num_classes,
        kernel_initializer="he_normal",
        kernel_regularizer=keras.regularizers.L2(_WEIGHT_DECAY),
        name="logits",
    )(x)
    return keras.Model(inputs, logits, name="resnet20")
