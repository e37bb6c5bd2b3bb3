"""The new user: a project directory outside the repository, holding `data/` (their records, written with plain
`tf.train.Example`) and `models/` (where they keep runs), and a task module of their own written against
docs/tasks.md alone: line-level language identification from UTF-8 bytes (a variable-length int64 feature, a
small masked conv model, their own metric, a serving signature). `python -m trainer` runs from that directory,
as they would.

It trains and serves what eval computed (the export, loaded in a fresh process, classifies the eval records
as eval counted them). Each bad input of the class a newcomer meets first ends with exit 2 and one `error:`
line, no traceback, and nothing written where the run was refused before training: a key typo on a
variable-length and on a fixed feature, a token id out of range in train and in eval records (declared
bounds), the same id with no bounds declared (the model's own lookup fails), and a module of the user's named
like a towerflow package.

Eight trainer processes, two at a time, and one serving process: about a minute on 2 idle cores.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from tests.support.paths import ROOT
from tests.support.runs import trainer_command

# No PYTHONPATH: the user's directory is found because `python -m` puts it first, towerflow by its install.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"CUDA_VISIBLE_DEVICES": ""}
STEPS = 60
LANGUAGES = ("english words and spaces ", "αβγδεζηθικλμνξοπρστυφχψω ", "日本語の文字列です漢字仮名 ")
BAD_ID = ord("€")  # 8364: the code point, where the records should hold its UTF-8 bytes
BAD_RECORD = 17

# What the user wrote, from docs/tasks.md: the padded positions are masked, as the page says to.
LANGID = '''
"""Which of three languages a line of text is in, from its UTF-8 bytes."""
import keras
import tensorflow as tf

from tasks import Feature, Task


class ByteConv(keras.Model):
    def __init__(self):
        super().__init__(name="byteconv")
        self.embed = keras.layers.Embedding(256, 16)
        self.conv = keras.layers.Conv1D(32, 3, padding="same", activation="relu")
        self.out = keras.layers.Dense(3)

    def call(self, inputs):
        ids, lengths = inputs
        mask = tf.sequence_mask(lengths, tf.shape(ids)[1], dtype="float32")[:, :, None]
        hidden = self.conv(self.embed(ids) * mask) * mask
        return self.out(tf.reduce_sum(hidden, 1) / tf.maximum(tf.reduce_sum(mask, 1), 1.0))


class LangId(Task):
    name, metric_names, eval_metric = "langid", ("accuracy",), "accuracy"

    def __init__(self, config):
        super().__init__(config)
        args = config.task.arg_dict
        self.key, self.label = args.get("bytes_key", "bytes"), args.get("label_key", "language")
        self.bounds = None if args.get("bounds") == "none" else (0, 256)

    def features(self):
        return {self.key: Feature("int64", max_length=64, bounds=self.bounds), self.label: Feature("int64")}

    def build_model(self):
        model = ByteConv()
        model((tf.zeros([1, 8], tf.int64), tf.constant([8])))
        return model

    def model_inputs(self, batch):
        return batch[self.key], batch[self.key + "_length"]

    def loss(self, outputs, batch):
        labels = batch[self.label]
        losses = keras.losses.sparse_categorical_crossentropy(labels, outputs, from_logits=True)
        return losses, tf.ones_like(losses)

    def metrics(self, outputs, batch):
        right = tf.equal(tf.argmax(outputs, -1), batch[self.label])
        return {"accuracy": (tf.reduce_sum(tf.cast(right, tf.float32)), tf.cast(tf.size(right), tf.float32))}

    def serving(self, model):
        def classify(ids, lengths):
            logits = model((ids, lengths))
            return {"language": tf.argmax(logits, -1), "logits": logits}

        specs = [tf.TensorSpec([None, None], tf.int64, name="ids"), tf.TensorSpec([None], tf.int32, name="lengths")]
        return {"serving_default": (classify, specs)}
'''

SERVE = r"""
import json, sys
import numpy as np
import tensorflow as tf
serve = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
spec = {"bytes": tf.io.RaggedFeature(tf.int64), "language": tf.io.FixedLenFeature([], tf.int64)}
right = total = 0
for record in tf.data.TFRecordDataset(sys.argv[2:]):
    example = tf.io.parse_single_example(record, spec)
    ids = example["bytes"][None, :]
    got = serve(ids=ids, lengths=tf.constant([ids.shape[1]], tf.int32))["language"].numpy()[0]
    right, total = right + int(got == example["language"].numpy()), total + 1
print(json.dumps({"right": right, "total": total}))
"""


def _line(rng, language: int) -> bytes:
    alphabet = LANGUAGES[language]
    return "".join(rng.choice(list(alphabet), size=rng.integers(4, 20))).encode()


def _write(path: str, lines: list[tuple[list[int], int]]) -> None:
    with tf.io.TFRecordWriter(path) as writer:
        for ids, language in lines:
            features = {
                "bytes": tf.train.Feature(int64_list=tf.train.Int64List(value=ids)),
                "language": tf.train.Feature(int64_list=tf.train.Int64List(value=[language])),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())


def _records(folder: str, seed: int, bad: str = "") -> tuple[str, str]:
    """Two train files of 240 lines and one eval file of 60; with `bad` ("train" or "eval"), record 17 of the
    second train file or of the eval file holds a code point (8364) instead of UTF-8 bytes."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder)
    spoilt = {"train": "train-00001-of-00002", "eval": "eval-00000-of-00001"}.get(bad)
    for name, count in (("train-00000-of-00002", 240), ("train-00001-of-00002", 240), ("eval-00000-of-00001", 60)):
        lines = [(list(_line(rng, i % 3)), i % 3) for i in range(count)]
        if name == spoilt:
            lines[BAD_RECORD] = ([*lines[BAD_RECORD][0][:5], BAD_ID], lines[BAD_RECORD][1])
        _write(os.path.join(folder, name), lines)
    return os.path.join(folder, "train-*"), os.path.join(folder, "eval-*")


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The user's directory: data/ with good and bad record sets, an empty models/, and langid.py."""
    home = tmp_path_factory.mktemp("newuser")
    assert not str(home).startswith(ROOT)
    os.makedirs(home / "models")
    (home / "langid.py").write_text(textwrap.dedent(LANGID))
    sets = {bad or "good": _records(str(home / "data" / (bad or "good")), 0, bad) for bad in ("", "train", "eval")}
    return home, sets


def _trainer(project_dir, name: str, data: tuple[str, str], *extra: str) -> list[str]:
    train, evaluation = (os.path.relpath(pattern, project_dir) for pattern in data)
    return [
        *trainer_command(), "--task=langid:LangId", "--device=cpu", "--num_gpus=2", "--deterministic",
        f"--train_data={train}", f"--eval_data={evaluation}",
        f"--train_steps={STEPS}", "--global_batch_size=32", "--optimizer=adam", "--learning_rate=0.01",
        "--log_every_steps=20", "--eval_every_steps=0", "--checkpoint_every_steps=20", f"--model_dir=models/{name}",
        *extra,
    ]  # fmt: skip


def _run_pairs(commands: dict[str, tuple[list[str], str]]) -> dict[str, subprocess.CompletedProcess]:
    """Runs each (command, cwd), two at a time (the machine has 2 cores); name -> the finished process."""
    names, done, pipe = list(commands), {}, subprocess.PIPE
    for i in range(0, len(names), 2):
        started = {
            n: subprocess.Popen(commands[n][0], cwd=commands[n][1], env=ENV, stdout=pipe, stderr=pipe, text=True)
            for n in names[i : i + 2]
        }
        for n, process in started.items():
            out, err = process.communicate(timeout=600)
            done[n] = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    return done


@pytest.fixture(scope="module")
def runs(project):
    home, sets = project
    shadow = home / "shadow"  # another project of theirs, whose task module is called tasks.py
    os.makedirs(shadow / "data")
    shutil.copy(home / "langid.py", shadow / "tasks.py")
    commands = {
        "good": _trainer(home, "good", sets["good"]),
        "typo_variable": _trainer(home, "typo_variable", sets["good"], "--task_args=bytes_key=byte"),
        "typo_fixed": _trainer(home, "typo_fixed", sets["good"], "--task_args=label_key=lang"),
        "bad_train": _trainer(home, "bad_train", sets["train"]),
        "bad_eval": _trainer(home, "bad_eval", sets["eval"]),
        "unbounded": _trainer(home, "unbounded", sets["train"], "--task_args=bounds=none"),
        "shadow": [*_trainer(home, "shadow", sets["good"]), "--task=tasks:LangId"],
    }
    return _run_pairs(
        {name: (command, str(shadow if name == "shadow" else home)) for name, command in commands.items()}
    )


def _one_error_line(run: subprocess.CompletedProcess) -> str:
    assert run.returncode == 2, run.stderr[-3000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, run.stderr[-3000:]
    return errors[0]


def _checkpoints(project_dir, name: str) -> list[str]:
    folder = os.path.join(project_dir, "models", name, "checkpoints")
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def test_their_task_trains_in_their_directory_and_serves_what_eval_computed(project, runs):
    home, sets = project
    good = runs["good"]
    assert good.returncode == 0, good.stderr[-3000:]
    assert "warning" not in good.stderr + good.stdout  # masked: the padding check has nothing to say
    with open(home / "models" / "good" / "metrics.json") as f:
        metrics = json.load(f)
    assert metrics["global_step"] == STEPS and metrics["eval_examples"] == 60
    assert metrics["eval_accuracy"] >= 0.9, metrics
    export = home / "models" / "good" / "export" / str(STEPS)
    evaluation = sorted(str(p) for p in (home / "data" / "good").glob("eval-*"))
    served = subprocess.run(
        [sys.executable, "-c", SERVE, str(export), *evaluation], cwd=home, env=ENV, capture_output=True, text=True
    )
    assert served.returncode == 0, served.stderr[-3000:]
    counts = json.loads(served.stdout.strip().splitlines()[-1])
    assert counts == {"right": round(metrics["eval_accuracy"] * 60), "total": 60}


MISSING = r"task 'langid': feature '{}' of \S*data/good/train-00000-of-00002 is missing \(keys found: bytes, language\)"
OUT_OF_BOUNDS = rf"task 'langid': feature 'bytes' of \S*data/eval/eval-00000-of-00001 record {BAD_RECORD} .*{BAD_ID}"


@pytest.mark.parametrize(
    "name, pattern",
    [("typo_variable", MISSING.format("byte")), ("typo_fixed", MISSING.format("lang")), ("bad_eval", OUT_OF_BOUNDS)],
)
def test_bad_records_are_refused_before_the_first_step(project, runs, name, pattern):
    home, _ = project
    assert re.search(pattern, _one_error_line(runs[name])), runs[name].stderr
    assert _checkpoints(home, name) == []


def test_an_id_out_of_its_bounds_in_training_names_the_record(project, runs):
    line = _one_error_line(runs["bad_train"])
    pattern = rf"task 'langid': feature 'bytes' of \S*data/train/train-00001-of-00002 record {BAD_RECORD} .*{BAD_ID}"
    assert re.search(pattern, line), line


def test_an_id_out_of_the_models_lookup_is_one_line_naming_the_feature(project, runs):
    line = _one_error_line(runs["unbounded"])
    assert "'bytes'" in line and "bounds" in line and str(BAD_ID) in line, line


def test_a_module_of_theirs_named_like_a_towerflow_package_is_refused(project, runs):
    home, _ = project
    line = _one_error_line(runs["shadow"])
    assert line.startswith(f"error: {home / 'shadow' / 'tasks.py'} has the name of towerflow's package 'tasks'"), line
    assert "rename it, for example to my_tasks.py" in line
    assert not os.path.exists(home / "shadow" / "models")  # refused before anything was made


def test_a_folder_named_like_a_package_is_harmless_even_behind_an_import_hook(tmp_path):
    """With towerflow reachable only through an import hook (setuptools' editable finder for flat layouts), a
    data/ folder first on the path would be found as a namespace package: `claim` loads towerflow's instead."""
    os.makedirs(tmp_path / "data")
    code = textwrap.dedent(f"""
        import sys
        from trainer.system import packages
        sys.path[:] = [{str(tmp_path)!r}] + [p for p in sys.path if p not in ("", {ROOT!r})]
        packages.claim()
        import data
        print(data.__file__, data.DataError.__name__)
    """)
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [os.path.join(ROOT, "data", "__init__.py"), "DataError"]
