"""Example of a user-defined model builder, usable as ``--model=models.examples:example_linear``.

Any importable function with this signature works the same way: ``build_model`` imports the module,
calls ``fn(input_shape, num_classes)`` and checks the result. Name every layer (and the Input) so that
variable paths such as ``logits/kernel`` are the same in every process, whatever was built before.
"""

import keras
from keras import layers


def example_linear(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
    """Multinomial logistic regression: Flatten -> Dense(num_classes) logits (no softmax)."""
    inputs = keras.Input(shape=input_shape, name="inputs")
    x = layers.Flatten(name="flatten")(inputs)
    logits = layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inputs, logits, name="example_linear")
