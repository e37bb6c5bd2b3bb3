"""Pieces shared by the built-in models: input-shape checks and a Dropout with a stable variable path."""

import keras

from models.registry import ModelError


def require_image_shape(model_name: str, input_shape: tuple[int, ...], min_size: int = 1) -> None:
    """Checks that ``input_shape`` is a channels-last image shape (H, W, C) with H, W >= ``min_size``.

    Raises:
      ModelError: naming the model, the shape received and what it needs.
    """
    if len(input_shape) != 3:
        raise ModelError(
            f"model {model_name!r} needs an image input_shape (height, width, channels); "
            f"got {input_shape} (rank {len(input_shape)})"
        )
    height, width, _ = input_shape
    if height < min_size or width < min_size:
        raise ModelError(
            f"model {model_name!r} needs images of at least {min_size}x{min_size}; got input_shape={input_shape}"
        )


@keras.saving.register_keras_serializable(package="towerflow")
class NamedDropout(keras.layers.Dropout):
    """``keras.layers.Dropout`` whose seed-generator variable lives under the layer's own name.

    Keras's Dropout names its ``SeedGenerator`` from a process-wide counter, so its state variable is
    ``seed_generator_<k>/seed_generator_state`` and ``k`` changes every time a model is built. Here the
    generator is created in ``build()``, inside the layer's name scope, which gives the stable path
    ``<layer name>/seed_generator/seed_generator_state``. Behaviour and config are those of Dropout.
    """

    def __init__(self, rate, noise_shape=None, seed=None, **kwargs):
        # rate=0 stops Dropout.__init__ from creating its counter-named generator; build() makes ours.
        super().__init__(0.0, noise_shape=noise_shape, seed=seed, **kwargs)
        if not 0 <= rate <= 1:
            raise ValueError(f"Dropout rate must be in [0, 1]; got {rate}")
        self.rate = rate

    def build(self, input_shape):
        """Creates the seed generator (only when dropout is active, as Dropout does)."""
        if self.rate > 0:
            self.seed_generator = keras.random.SeedGenerator(self.seed, name="seed_generator")
