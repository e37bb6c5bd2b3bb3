"""``mlp``: a three-layer perceptron for inputs of any rank (flattened first)."""

import keras
from keras import layers

from models.registry import register


@register("mlp")
def mlp(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
    """Flatten -> Dense(256, relu) -> Dense(128, relu) -> Dense(num_classes) logits."""
    inputs = keras.Input(shape=input_shape, name="inputs")
    x = layers.Flatten(name="flatten")(inputs)
    x = layers.Dense(256, activation="relu", name="dense1")(x)
    x = layers.Dense(128, activation="relu", name="dense2")(x)
    logits = layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inputs, logits, name="mlp")
