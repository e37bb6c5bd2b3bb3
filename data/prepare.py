"""Writes ready-to-train TFRecords: `python -m data.prepare {digits,synthetic,text} ... OUT_DIR [options]`.

    python -m data.prepare digits /tmp/digits
    python -m data.prepare synthetic /tmp/synth --shape=32,32,3 --num_classes=10 --num_examples=5000
    python -m data.prepare synthetic /tmp/dense --shape=20 --num_classes=4 --num_examples=1000
    python -m data.prepare synthetic /tmp/jpeg --format=jpeg --shape=375,500,3 --num_classes=1000 --num_examples=512
    python -m data.prepare text input.txt /tmp/shakespeare --context=256   # --tokens=byte, the default
    python -m data.prepare text input.txt /tmp/sp8k --tokens=subword --vocab_size=8000 --context=256
    python -m data.prepare text 'src/**/*.py' /tmp/code   # a quoted glob: its files, any depth, sorted

Each writes OUT_DIR/train-*-of-*, OUT_DIR/eval-*-of-* and OUT_DIR/info.json (counts, shape, num_classes,
schema kind; `text` writes vocab.json instead, see data/text.py), and prints the two globs to pass as
--train_data and --eval_data. Arguments are checked before TensorFlow is imported, so a typo fails in
milliseconds with exit code 2. TensorFlow's C++ log lines are kept off stderr as `python -m trainer` keeps
them (`data.native_log`: TF_CPP_MIN_LOG_LEVEL=3 unless the environment sets it; TF_CPP_MIN_LOG_LEVEL=0 shows
them all).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

from data import native_log
from data.schema import DataError


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) not in (1, 3) or min(shape) < 1:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not H,W,C (images) or D (dense vectors) with positive integers, e.g. 28,28,1 or 784"
        )
    return shape


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m data.prepare", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    digits = commands.add_parser("digits", help="scikit-learn's 8x8 digits: 1437 train, 360 eval, 10 classes")
    digits.add_argument("out_dir")
    synthetic = commands.add_parser("synthetic", help="learnable synthetic data: class template + noise")
    synthetic.add_argument("out_dir")
    synthetic.add_argument("--shape", type=_shape, required=True, help="H,W,C for images (C=1 or 3), D for dense")
    synthetic.add_argument("--num_classes", type=int, required=True)
    synthetic.add_argument("--num_examples", type=int, required=True, help="train examples")
    synthetic.add_argument("--eval_examples", type=int, default=None, help="default: num_examples // 5")
    synthetic.add_argument("--num_shards", type=int, default=4, help="train files; eval gets min(this, its count)")
    synthetic.add_argument(
        "--format",
        "--image_format",
        dest="image_format",
        choices=("png", "jpeg"),
        default="png",
        help="images only. png: pixel-noise templates, lossless; jpeg: smooth photo-like templates (quality 95, "
        "~100 KB at 500x375)",
    )
    synthetic.add_argument("--seed", type=int, default=0)
    text = commands.add_parser("text", help="UTF-8 text files -> token records for --task=lm (data/text.py)")
    text.add_argument(
        "files",
        nargs="+",
        metavar="FILES",
        help="UTF-8 text files, concatenated in this order; a quoted glob ('src/**/*.py': ** at any depth) is "
        "expanded here, its files in sorted order",
    )
    text.add_argument("out_dir", metavar="OUT")
    text.add_argument(
        "--tokens",
        choices=("byte", "char", "subword"),
        default="byte",
        help="byte (default): the text's UTF-8 bytes, a fixed vocabulary of 256 that holds any text; char: one "
        "token per character the text holds (a vocabulary of its own, shorter sequences for non-ASCII text); "
        "subword: a SentencePiece model of --vocab_size tokens trained on the train split (data/subword.py)",
    )
    text.add_argument("--context", type=int, default=64, help="tokens the model sees; records hold up to +1")
    text.add_argument("--eval_fraction", type=float, default=0.1, help="the text's last share, held out")
    text.add_argument("--documents", choices=("none", "paragraphs"), default="none")
    text.add_argument(
        "--vocab_size",
        type=int,
        default=None,
        help="subword tokens: the vocabulary's size. The model's embedding and output projection grow with it "
        "(width x size each): the default model (width 128) trains at ~0.45-0.8x byte tokens' tokens/s at 2000 "
        "and ~0.2-0.45x at 8000 (where the projection outweighs the blocks); about 4 x layers x width (2000 for the "
        "default model) keeps it to a quarter of the matmuls (benchmarks/results/lm-vocab.md)",
    )
    text.add_argument(
        "--subword_model", choices=("bpe", "unigram"), default=None, help="subword tokens: the algorithm (bpe)"
    )
    return parser


def _check_text(args: argparse.Namespace) -> None:
    """Rejects bad values with one line (DataError), before TensorFlow is imported."""
    from data import subword

    if args.context < 1:
        raise DataError(f"--context ({args.context}) must be >= 1")
    if not 0.0 < args.eval_fraction < 1.0:
        raise DataError(f"--eval_fraction ({args.eval_fraction}) must be in (0, 1)")
    if args.tokens != "subword":
        given = [f"--{name}" for name in ("vocab_size", "subword_model") if getattr(args, name) is not None]
        if given:
            raise DataError(f"{' and '.join(given)} is for --tokens=subword, not --tokens={args.tokens}")
    elif args.vocab_size is None:
        raise DataError("--tokens=subword needs --vocab_size (e.g. 8000)")
    elif not subword.MIN_VOCAB <= args.vocab_size <= subword.MAX_VOCAB:
        raise DataError(f"--vocab_size ({args.vocab_size}) must be in [{subword.MIN_VOCAB}, {subword.MAX_VOCAB}]")
    args.subword_model = args.subword_model or "bpe"
    args.files = [name for path in args.files for name in _text_files(path)]


def _text_files(path: str) -> list[str]:
    """`path` itself, or the files a glob matches (`**` any depth), in sorted order: the same list on any machine.

    Raises:
        DataError: a directory (naming a glob of its most common kind of file), a glob without files, a missing file.
    """
    if os.path.isfile(path):
        return [path]
    if os.path.isdir(path):
        example = os.path.join(path, "**", f"*{_common_suffix(path)}")
        raise DataError(
            f"text file {path} is a directory: give its files, e.g. '{example}' (in quotes: expanded here, "
            "recursively, in sorted order)"
        )
    if glob.has_magic(path):
        files = sorted(name for name in glob.glob(path, recursive=True) if os.path.isfile(name))
        if files:
            return files
        raise DataError(f"no text files match '{path}'; check the pattern")
    raise DataError(f"text file {path} does not exist; give UTF-8 text files before OUT")


def _common_suffix(directory: str) -> str:
    """The most common file name suffix under `directory` (".py"), "" for none; hidden folders left out."""
    counts: dict[str, int] = {}
    for _root, folders, names in os.walk(directory):
        folders[:] = [f for f in folders if not f.startswith((".", "__"))]
        for name in names:
            suffix = os.path.splitext(name)[1]
            counts[suffix] = counts.get(suffix, 0) + 1
    return min(counts, key=lambda suffix: (-counts[suffix], suffix)) if counts else ""


def _check_synthetic(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Fills defaults and rejects bad values with parser.error (exit code 2)."""
    if args.eval_examples is None:
        args.eval_examples = max(1, args.num_examples // 5)
    if args.num_classes < 1:
        parser.error(f"--num_classes ({args.num_classes}) must be >= 1")
    if args.num_examples < 1:
        parser.error(f"--num_examples ({args.num_examples}) must be >= 1")
    if args.eval_examples < 1:
        parser.error(f"--eval_examples ({args.eval_examples}) must be >= 1")
    if not 1 <= args.num_shards <= args.num_examples:
        parser.error(f"--num_shards ({args.num_shards}) must be in [1, --num_examples={args.num_examples}]")
    if len(args.shape) == 3 and args.shape[2] not in (1, 3):
        parser.error(f"--shape={','.join(map(str, args.shape))}: channels must be 1 (grayscale) or 3 (RGB)")


def _write_synthetic(args: argparse.Namespace) -> tuple[str, str]:
    from data import synthetic, writer  # TensorFlow loads only once the arguments are known to be good

    is_image = len(args.shape) == 3
    # JPEG of pixel noise is ~3x the size of a photo's; smooth templates compress like photos do.
    splits = synthetic.photo_splits if is_image and args.image_format == "jpeg" else synthetic.synthetic_splits
    train, held_out = splits(args.shape, args.num_classes, args.num_examples, args.eval_examples, seed=args.seed)
    shards = {"train": args.num_shards, "eval": min(args.num_shards, args.eval_examples)}
    for split, (examples, labels) in (("train", train), ("eval", held_out)):
        prefix = os.path.join(args.out_dir, split)
        if is_image:
            writer.write_image_records(
                prefix, examples, labels, num_shards=shards[split], image_format=args.image_format
            )
        else:
            writer.write_dense_records(prefix, examples, labels, num_shards=shards[split])
    patterns = {split: f"{split}-*-of-{count:05d}" for split, count in shards.items()}
    info = {
        "name": "synthetic",
        "schema": "image" if is_image else "dense",
        "shape": list(args.shape),
        "num_classes": args.num_classes,
        "counts": {"train": args.num_examples, "eval": args.eval_examples},
        "files": patterns,
        "seed": args.seed,
    }
    if is_image:
        info["image_format"] = args.image_format
    with open(os.path.join(args.out_dir, "info.json"), "w") as f:
        json.dump(info, f, indent=2)
    return os.path.join(args.out_dir, patterns["train"]), os.path.join(args.out_dir, patterns["eval"])


def _write_text(args: argparse.Namespace) -> tuple[str, str]:
    """Writes the records, showing each pass on stderr (`data.phase`; stdout keeps the two globs), and one
    line on stderr at the end: what was written, from what, in how long."""
    import time

    from data import phase, text

    started = time.monotonic()
    options = (args.tokens, args.context, args.eval_fraction, args.documents, args.vocab_size, args.subword_model)
    train_glob, eval_glob, vocab_path = text.write_text_records(args.files, args.out_dir, *options, sys.stderr)
    with open(vocab_path, encoding="utf-8") as f:
        info = json.load(f)
    records, size = info["records"], sum(info["bytes"].values())
    shards = {"train": len(glob.glob(train_glob)), "eval": len(glob.glob(eval_glob))}
    print(
        f"wrote {records['train']:,} train records ({shards['train']} files) and {records['eval']:,} eval records "
        f"({shards['eval']} file{'s' if shards['eval'] != 1 else ''}) of {info['train_tokens']:,} + "
        f"{info['eval_tokens']:,} {args.tokens} tokens from {len(args.files)} file{'s' if len(args.files) != 1 else ''}"
        f" ({size / 1e6:,.1f} MB) in {phase.format_duration(time.monotonic() - started)}",
        file=sys.stderr,
    )
    return train_glob, eval_glob


def main(argv: list[str] | None = None) -> int:
    """Runs the command line.

    Args:
        argv: Arguments without the program name; None means sys.argv[1:].

    Returns:
        The exit code: 0 on success, 2 for bad data. Bad arguments raise SystemExit(2) (argparse).
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "synthetic":
        _check_synthetic(args, parser)
    try:
        if args.command == "text":
            _check_text(args)
        if args.command != "text":  # text imports it once a subword model is trained (data.text_records)
            with native_log.quiet_first_import(native_log.QUIET_LEVEL):  # as `python -m trainer` keeps it quiet
                import tensorflow  # noqa: F401, PLC0415 (after the checks: a bad argument fails in milliseconds)
        if args.command == "digits":
            from data import digits

            train_glob, eval_glob = digits.write_digits(args.out_dir)
        elif args.command == "text":
            train_glob, eval_glob = _write_text(args)
        else:
            train_glob, eval_glob = _write_synthetic(args)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"--train_data={train_glob}")
    print(f"--eval_data={eval_glob}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
