"""What a user can rely on for bad input: `python -m trainer` exits 2 within 2 s (before TensorFlow is
imported), with exactly one line on stderr, "error: ...", naming the flag, the file, the directory or the port.

The table is also in docs/signals-and-exit-codes.md ("Bad input"), as a user sees it. Each row runs the real
command line in a subprocess. {tmp} is a directory of prepared files, {held} a port another process listens on,
{free} a free one.
"""

import json
import os
import re
import socket
import subprocess

import pytest

from launch.testslurm.ports import free_ports
from tests.support.paths import ROOT
from tests.support.runs import cpu_flags, run_trainer

# "At once" means before TensorFlow is imported (its import alone takes 2-5 s here): each row runs with a
# `tensorflow` package first on the path that fails any import of it, so a row that imports TensorFlow fails
# on that, whatever the machine's load (a time bound of 2 s failed once under load for a row that never
# imported it).
NO_TENSORFLOW = 'raise ImportError("TensorFlow was imported before the bad input was refused")\n'
DATA = ["--num_classes=10", "--eval_data={tmp}/data/train-0*"]
LM = ["--task=lm", "--train_data={tmp}/sw2000/t*"]
# vocab.json as `python -m data.prepare text` writes it (what the checks before TensorFlow read of it)
VOCABS = {
    "sw2000": {"tokens": "subword", "vocab_size": 2000, "model_file": "subword.model", "model_sha256": "ab" * 32},
    "sw1000": {"tokens": "subword", "vocab_size": 1000, "model_file": "subword.model", "model_sha256": "cd" * 32},
    "byte": {"tokens": "byte", "vocab_size": 256},
}


def _tf_config(index: int, ports: str) -> dict:
    workers = [f"127.0.0.1:{{{p}}}" for p in ports.split(",")]
    return {"TF_CONFIG": json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})}


# (id, arguments, environment, the start of the one line on stderr)
ROWS = [
    # flags absl cannot parse
    ("unknown", ["--nosuchflag"], {}, "error: unknown flag --nosuchflag"),
    ("misspelt", ["--model_di=x"], {}, "error: unknown flag --model_di (did you mean --model_dir?)"),
    ("no-on-value", ["--noseed"], {}, "error: unknown flag --noseed"),
    ("int-text", ["--num_gpus=abc"], {}, "error: --num_gpus=abc must be an integer"),
    ("int-float", ["--global_batch_size=1.5"], {}, "error: --global_batch_size=1.5 must be an integer"),
    ("float-text", ["--learning_rate=fast"], {}, "error: --learning_rate=fast must be a number"),
    ("bool-text", ["--export=maybe"], {}, "error: --export=maybe must be true or false"),
    ("enum", ["--device=tpu"], {}, "error: --device=tpu must be one of gpu, cpu"),
    ("enum-mode", ["--update_mode=lazy"], {}, "error: --update_mode=lazy must be one of sync, async"),
    ("no-value", ["--num_gpus"], {}, "error: --num_gpus needs a value"),
    ("positional", ["train"], {}, "error: unexpected arguments: train"),
    # values the flag table refuses
    ("seed-negative", ["--seed=-1"], {}, "error: --seed (-1) must be in [0, 4294967295]"),
    ("seed-too-big", ["--seed=4294967296"], {}, "error: --seed (4294967296) must be in [0, 4294967295]"),
    ("lr-inf", ["--learning_rate=inf"], {}, "error: --learning_rate (inf) must be a finite positive number"),
    ("lr-nan", ["--learning_rate=nan"], {}, "error: --learning_rate (nan) must be a finite positive number"),
    ("lr-zero", ["--learning_rate=0"], {}, "error: --learning_rate (0.0) must be positive"),
    ("momentum", ["--momentum=1.5"], {}, "error: --momentum (1.5) must be in [0, 1]"),
    ("clip", ["--clip_global_norm=-1"], {}, "error: --clip_global_norm (-1.0) must be a finite number >= 0"),
    ("towers", ["--num_gpus=0"], {}, "error: --num_gpus (0) must be at least 1"),
    ("batch", ["--global_batch_size=0"], {}, "error: --global_batch_size (0) must be at least 1"),
    ("batch-split", ["--num_gpus=3", "--global_batch_size=100"], {}, "error: --global_batch_size (100) must be"),
    ("micro", ["--num_gpus=2", "--micro_batches=3"], {}, "error: --micro_batches (3) must be a multiple"),
    ("steps", ["--train_steps=0"], {}, "error: --train_steps (0) must be at least 1"),
    ("warmup", ["--train_steps=5", "--warmup_steps=10"], {}, "error: --warmup_steps (10) must be in"),
    ("piecewise", ["--lr_schedule=piecewise", "--lr_boundaries=5"], {}, "error: --lr_values needs one more value"),
    ("int-list", ["--lr_boundaries=a,b"], {}, "error: --lr_boundaries (a,b) must be comma-separated integers"),
    ("image-size", ["--image_size=0,0"], {}, "error: --image_size (0,0) must be two positive integers"),
    ("profile", ["--profile_steps=5"], {}, "error: --profile_steps (5) must be two steps A,B"),
    ("keep", ["--keep_checkpoints=0"], {}, "error: --keep_checkpoints (0) must be at least 1"),
    ("async-det", ["--update_mode=async", "--deterministic"], {}, "error: --update_mode=async cannot be"),
    (
        "memory-async",
        ["--update_mode=async", "--nodeterministic", "--device_memory_mb=100"],
        {},
        "error: --device_memory_mb (100) is counted from a sync step",
    ),
    ("stages-divide", ["--num_gpus=4", "--pipeline_stages=3"], {}, "error: --pipeline_stages (3) must divide"),
    ("remat-alone", ["--pipeline_remat"], {}, "error: --pipeline_remat needs --pipeline_stages > 1"),
    (
        "stages-async",
        ["--num_gpus=2", "--pipeline_stages=2", "--update_mode=async", "--nodeterministic"],
        {},
        "error: --pipeline_stages (2) needs --update_mode=sync",
    ),
    (
        "stages-spread",
        ["--num_gpus=2", "--pipeline_stages=2", "--parameter_device=spread"],
        {},
        "error: --parameter_device=spread cannot be used with --pipeline_stages",
    ),
    (
        "stages-xla",
        ["--num_gpus=2", "--pipeline_stages=2", "--xla"],
        {},
        "error: --xla cannot be used with --pipeline_stages (2) yet",
    ),
    (
        "stages-cuts",
        ["--num_gpus=4", "--pipeline_stages=2", "--pipeline_cuts=conv1,bn1"],
        {},
        "error: --pipeline_cuts names 2 place(s) and --pipeline_stages=2 needs 1",
    ),
    ("gpu-on-cpu", ["--gpu_memory_growth"], {}, "error: --gpu_memory_growth cannot apply with --device=cpu"),
    ("normalize", ["--normalize=bogus"], {}, "error: --normalize ('bogus') must be"),
    ("grappler", ["--grappler=nonsense=on"], {}, "error: --grappler: unknown option 'nonsense'"),
    ("eval-alone", ["--eval_data=x"], {}, "error: --eval_data needs --train_data"),
    (
        "task",
        ["--task=nonsense"],
        {},
        "error: --task='nonsense': unknown task; built-in tasks are classify, lm, or name your own as "
        "'package.module:Class'",
    ),
    (
        "task-module",
        ["--task=nosuch.mod:X"],
        {},
        "error: --task='nosuch.mod:X': cannot import module 'nosuch.mod': No module named 'nosuch'",
    ),
    ("classes", ["--train_data=x", "--eval_data=x"], {}, "error: --num_classes (0) must be given"),
    # flag files
    ("ff-missing", ["--flagfile={tmp}/missing.txt"], {}, "error: --flagfile={tmp}/missing.txt: cannot read it"),
    ("ff-dir", ["--flagfile={tmp}/data"], {}, "error: --flagfile={tmp}/data: cannot read it: Is a directory"),
    ("ff-unknown", ["--flagfile={tmp}/unknown.txt"], {}, "error: unknown flag --bogus (in --flagfile={tmp}/unknown"),
    ("ff-value", ["--flagfile={tmp}/value.txt"], {}, "error: --num_gpus=two (in --flagfile={tmp}/value.txt)"),
    ("ff-nested", ["--flagfile={tmp}/nested.txt"], {}, "error: --flagfile={tmp}/missing.txt (named in {tmp}/nested"),
    ("ff-binary", ["--flagfile={tmp}/binary.txt"], {}, "error: --flagfile={tmp}/binary.txt: not a text file"),
    ("ff-no-dashes", ["--flagfile={tmp}/dashless.txt"], {}, "error: unexpected arguments: seed=1"),
    ("ff-empty-name", ["--flagfile="], {}, "error: --flagfile needs a file name"),
    ("ff-no-name", ["--flagfile"], {}, "error: --flagfile needs a value"),
    # data
    ("no-match", ["--train_data={tmp}/none/*", *DATA], {}, "error: no files match --train_data pattern '{tmp}/none/*'"),
    ("dir-match", ["--train_data={tmp}/data/*", *DATA], {}, "error: --train_data pattern '{tmp}/data/*' matches the"),
    ("eval-none", ["--train_data={tmp}/data/t*", "--num_classes=10", "--eval_data={tmp}/e*"], {}, "error: no files"),
    # token records (a vocab.json beside them, as `python -m data.prepare text` writes)
    (
        "lm-no-task",
        ["--train_data={tmp}/sw2000/t*", "--eval_data={tmp}/sw2000/t*"],
        {},
        "error: --train_data holds the language model's token records ({tmp}/sw2000/vocab.json: subword tokens, 2000 "
        "of them (model sha256 abababababab)), not images or vectors with class labels; did you mean --task=lm?",
    ),
    (
        "lm-vocab",
        [*LM, "--eval_data={tmp}/sw1000/t*"],
        {},
        "error: --train_data and --eval_data are records of different vocabularies: {tmp}/sw2000/vocab.json says "
        "subword tokens, 2000 of them (model sha256 abababababab), {tmp}/sw1000/vocab.json says subword tokens, 1000 "
        "of them (model sha256 cdcdcdcdcdcd); prepare both from the same",
    ),
    (
        "lm-tokens",
        [*LM, "--eval_data={tmp}/byte/t*"],
        {},
        "error: --train_data and --eval_data are records of different vocabularies: {tmp}/sw2000/vocab.json says "
        "subword tokens, 2000 of them (model sha256 abababababab), {tmp}/byte/vocab.json says byte tokens;",
    ),
    (
        "lm-context",
        [*LM, "--eval_data={tmp}/sw2000/t*", "--lm_context=32"],
        {},
        "error: the records were written for context 64 ({tmp}/sw2000/vocab.json), longer than the model's context 32 "
        "(--lm_context): pass --lm_context=64, or rewrite the records",
    ),
    (
        "lm-shards",
        [*LM, "--eval_data={tmp}/sw2000/t*", "--num_gpus=2", "--tensor_parallel=2", "--lm_heads=3", "--lm_width=96"],
        {},
        "error: --tensor_parallel (2, the shard count without --tensor_shards) must divide --lm_heads (3): each shard "
        "holds an equal slice of the heads; use a shard count that divides 3",
    ),
    # directories
    ("dir-is-file", ["--model_dir={tmp}/file"], {}, "error: --model_dir={tmp}/file is a file, not a directory"),
    ("dir-in-file", ["--model_dir={tmp}/file/run"], {}, "error: --model_dir={tmp}/file/run: a part of the path"),
    ("dir-empty", ["--model_dir="], {}, "error: --model_dir ('') must not be empty"),
    ("dir-read-only", ["--model_dir={ro}"], {}, "error: --model_dir={ro} cannot be written"),
    ("dir-not-creatable", ["--model_dir={ro}/run"], {}, "error: --model_dir={ro}/run cannot be created"),
    # ports and environment
    ("chief-port", [], _tf_config(0, "held,free"), "error: port {held} of task 0 (the chief at 127.0.0.1:{held}"),
    ("worker-port", [], _tf_config(1, "free,held"), "error: port {held} of task 1 (a worker at 127.0.0.1:{held}"),
    ("tf-config-json", [], {"TF_CONFIG": "{bad"}, "error: TF_CONFIG is not valid JSON"),
    ("tf-config-index", [], _tf_config(5, "free,free"), "error: TF_CONFIG's task.index (5) is not in [0, 2)"),
    ("slurm-nodes", [], {"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2"}, "error: this Slurm"),
    ("cache-is-file", [], {"TOWERFLOW_CACHE": "{tmp}/file"}, "error: the digits' cache TOWERFLOW_CACHE={tmp}/file"),
]


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    """The files, directories and ports the rows name."""
    tmp = tmp_path_factory.mktemp("bad")
    (tmp / "file").write_text("not a directory\n")
    (tmp / "data" / "sub").mkdir(parents=True)
    (tmp / "data" / "train-00000").write_bytes(b"")
    (tmp / "unknown.txt").write_text("--seed=1\n--bogus=3\n")
    (tmp / "value.txt").write_text("--num_gpus=two\n")
    (tmp / "nested.txt").write_text(f"--flagfile={tmp}/missing.txt\n")
    (tmp / "binary.txt").write_bytes(b"\xff\xfe--seed=1\n")
    (tmp / "dashless.txt").write_text("seed=1\n")
    for name, vocab in VOCABS.items():
        (tmp / name).mkdir()
        (tmp / name / "train-00000-of-00001.tfrecord").write_bytes(b"")
        (tmp / name / "vocab.json").write_text(json.dumps({**vocab, "context": 64}))
    (tmp / "guard" / "tensorflow").mkdir(parents=True)
    (tmp / "guard" / "tensorflow" / "__init__.py").write_text(NO_TENSORFLOW)
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(8)
    values = {"tmp": str(tmp), "held": str(held.getsockname()[1]), "free": str(free_ports(1)[0])}
    with _read_only_dir(tmp) as ro:
        yield {**values, "ro": ro}
    held.close()


class _read_only_dir:
    """A read-only file system (a tmpfs mounted ro) as root, who may write anywhere else; else a 0555 dir."""

    def __init__(self, tmp):
        self.path = str(tmp / "ro")
        os.mkdir(self.path)

    def __enter__(self):
        if os.geteuid() == 0:
            subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", self.path], check=True)
        else:
            os.chmod(self.path, 0o555)
        return self.path

    def __exit__(self, *exc):
        if os.geteuid() == 0:
            subprocess.run(["umount", self.path], check=False)


def _filled(text: str, places: dict) -> str:
    for name, value in places.items():
        text = text.replace(f"{{{name}}}", value)
    return text


@pytest.mark.quick
@pytest.mark.parametrize(("args", "env", "first_line"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_bad_input_exits_2_at_once_with_one_line(places, tmp_path, args, env, first_line):
    args = [_filled(a, places) for a in args]
    if not any(a.startswith("--model_dir") for a in args):
        args.insert(0, f"--model_dir={tmp_path}/run")  # first: a bare --flag takes the next argument
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM") and k != "TF_CONFIG"}
    env = {**base, "CUDA_VISIBLE_DEVICES": "", **{k: _filled(v, places) for k, v in env.items()}}
    env["PYTHONPATH"] = os.pathsep.join([f"{places['tmp']}/guard", ROOT])
    result = run_trainer(*cpu_flags(num_gpus=None), *args, env=env, timeout=60)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(_filled(first_line, places)), result.stderr
    assert not os.path.exists(f"{tmp_path}/run/checkpoints")


def test_the_readmes_examples_are_rows_of_the_table():
    """README.md's bad-input examples are what this table checks: each invocation is a row's first argument
    (with /x standing for the row's prepared directory and /ro for the read-only one), its stderr that row's
    line."""
    with open(os.path.join(ROOT, "README.md")) as f:
        examples = re.findall(r"^\| `(--[^`]*)`[^|]*\| `(error: [^`]*)` \|$", f.read(), re.MULTILINE)
    assert len(examples) >= 5, examples
    shown = {"tmp": "/x", "ro": "/ro"}
    rows = {_filled(row[1][0], shown): _filled(row[3], shown) for row in ROWS if row[1]}
    for invocation, line in examples:
        expected = rows.get(invocation.replace("'", ""))
        assert expected is not None and line.startswith(expected), (invocation, line, expected)


def test_the_table_is_documented():
    """docs/signals-and-exit-codes.md lists every row of the table, as what a user can rely on: the same
    invocation and the same start of the line (/x for the prepared directory, /ro the read-only one, 7000 the
    held port, 7001 a free one)."""
    with open(os.path.join(ROOT, "docs", "signals-and-exit-codes.md")) as f:
        page = f.read()
    documented = {m[0]: m[1:] for m in re.findall(r"^\| `([\w-]+)` \| `([^`]*)` \| `([^`]*)` \|$", page, re.MULTILINE)}
    shown = {"tmp": "/x", "ro": "/ro", "held": "7000", "free": "7001"}
    missing = [row[0] for row in ROWS if row[0] not in documented]
    assert not missing, missing
    for case, args, env, line in ROWS:
        invocation, stderr = documented[case]
        assert stderr == _filled(line, shown), (case, stderr)
        if not env:  # a row with an environment shows it in words
            assert invocation == " ".join(["python -m trainer", *(_filled(a, shown) for a in args)]), case
