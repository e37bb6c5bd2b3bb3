"""`--task=lm`'s arguments, the language model's sizes, declared without TensorFlow (`tasks.lm` imports Keras):
the engine makes their `--lm_*` flags from here and checks them before TensorFlow starts."""

from __future__ import annotations

from tasks.options import Argument, Options

POSITIONS = ("learned", "rotary")  # models.transformer.POSITIONS (a test keeps them equal)


def _heads_divide_width(config, values: dict) -> str:
    del config
    if values["width"] % values["heads"]:
        return f"--lm_heads ({values['heads']}) must divide --lm_width ({values['width']})"
    return ""


OPTIONS = Options(
    help="lm: a decoder-only Transformer language model over text records (python -m data.prepare text; without "
    "--train_data the built-in corpus).",
    arguments=(
        Argument("layers", "lm_layers", 4, "--task=lm: Transformer blocks.", low=1),
        Argument("heads", "lm_heads", 4, "--task=lm: attention heads; they divide --lm_width.", low=1),
        Argument("width", "lm_width", 128, "--task=lm: the model width (embedding size).", low=1),
        Argument(
            "context", "lm_context", 64, "--task=lm: tokens a prediction sees; records hold up to this + 1.", low=1
        ),
        Argument("positions", "lm_positions", "learned", "--task=lm: position encoding.", choices=POSITIONS),
        Argument("dropout", "lm_dropout", 0.0, "--task=lm: dropout rate, in [0, 1).", low=0, high=0.99),
    ),
    rule=_heads_divide_width,
)
