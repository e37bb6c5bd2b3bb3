"""`--task=lm`'s arguments, the language model's sizes, declared without TensorFlow (`tasks.lm` imports Keras):
the engine makes their `--lm_*` flags from here and checks them before TensorFlow starts."""

from __future__ import annotations

from data import text_vocab
from tasks.options import Argument, Options

POSITIONS = ("learned", "rotary")  # models.transformer.POSITIONS (a test keeps them equal)
# --lm_preset: named sizes. gpt2-small is GPT-2 small's shape (Radford et al. 2019; nanoGPT's `gpt2`).
PRESETS = {"none": {}, "gpt2-small": {"layers": 12, "heads": 12, "width": 768, "context": 1024}}


def _heads_divide_width(config, values: dict) -> str:
    if values["width"] % values["heads"]:
        return f"--lm_heads ({values['heads']}) must divide --lm_width ({values['width']})"
    return _shards_divide(config, values["heads"], "--lm_heads", "heads")


def _shards_divide(config, size: int, named: str, what: str) -> str:
    """The model's tensor shards (models.transformer) must divide its heads (a vocabulary they do not divide is
    padded, models.vocab_shards); the problem names the flag that set the shard count."""
    split = config.towers.tensor
    if size % split.shards == 0:
        return ""
    return (
        f"{split.shards_named} must divide {named} ({size}): each shard holds an equal slice of the {what}; "
        f"use a shard count that divides {size}"
    )


def _records(config, values: dict) -> tuple[str, list[str]]:
    """The train and eval records' vocab.json (data.text_vocab): one vocabulary, written for no longer a context
    than the model's; a shorter one is a warning. Nothing to say for the built-in corpus or records without it."""
    d = config.data
    train = text_vocab.vocab_beside(d.train_data) if d.train_data else None
    if train is None:
        return "", []
    evaluation = text_vocab.vocab_beside(d.eval_data) if d.eval_data else None
    context, flag = values["context"], _context_flag(values)
    problem = text_vocab.mismatch(train, evaluation) or text_vocab.context_problem(train, context, flag)
    if not problem and evaluation is not None:
        problem = text_vocab.context_problem(evaluation, context, flag)
    warning = text_vocab.context_warning(train, context, flag)
    return problem, [warning] if warning else []


def _context_flag(values: dict) -> str:
    """Where the model's context came from: --lm_context, or the preset that set it."""
    preset = values["preset"]
    if PRESETS.get(preset, {}).get("context") == values["context"]:
        return f"--lm_context, set by --lm_preset={preset}"
    return "--lm_context"


SIZES = (
    Argument("layers", "lm_layers", 4, "--task=lm: Transformer blocks.", low=1),
    Argument("heads", "lm_heads", 4, "--task=lm: attention heads; they divide --lm_width.", low=1),
    Argument("width", "lm_width", 128, "--task=lm: the model width (embedding size).", low=1),
    Argument("context", "lm_context", 64, "--task=lm: tokens a prediction sees; records hold up to this + 1.", low=1),
)
_DEFAULTS = {a.name: a.default for a in SIZES}


def _preset_sizes(values: dict) -> dict:
    """The one place a preset and the size flags meet: each size the preset names replaces that size's default;
    a size set away from its default is the user's and stays (`--lm_preset=gpt2-small --lm_context=256`). A
    size set to its own default cannot be told from one not given: it takes the preset's."""
    preset = PRESETS.get(values["preset"], {})  # an unknown name is refused by the argument's own check
    return {**values, **{k: v for k, v in preset.items() if values[k] == _DEFAULTS[k]}}


OPTIONS = Options(
    help="lm: a decoder-only Transformer language model over text records (python -m data.prepare text; without "
    "--train_data the built-in corpus).",
    arguments=(
        Argument(
            "preset",
            "lm_preset",
            "none",
            "--task=lm: named sizes: gpt2-small = 12 layers, 12 heads, width 768, context 1024 (GPT-2 small's "
            "shape). A --lm_layers/--lm_heads/--lm_width/--lm_context set away from its default overrides the "
            "preset's value.",
            choices=tuple(PRESETS),
        ),
        *SIZES,
        Argument("positions", "lm_positions", "learned", "--task=lm: position encoding.", choices=POSITIONS),
        Argument("dropout", "lm_dropout", 0.0, "--task=lm: dropout rate, in [0, 1).", low=0, high=0.99),
    ),
    rule=_heads_divide_width,
    fill=_preset_sizes,
    records=_records,
)
