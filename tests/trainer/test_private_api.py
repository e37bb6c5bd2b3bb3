"""Every private TensorFlow or Keras API `trainer/` reads is a row of docs/facts.md's table (read from there, so
the doc and this test cannot drift), and each row's test, here, exercises what it reads."""

import ast
import os
import pathlib
import re
import subprocess
import sys

import pytest
import tensorflow as tf

from tests.support.paths import ROOT_PATH as ROOT

SECTION = "## Private TensorFlow and Keras APIs"
PRIVATE_MODULES = ("tensorflow.python", "keras.src")
PUBLIC_PRIVATES = {"os._exit"}  # Python's own documented functions with a leading underscore


def _table() -> dict[tuple[str, str], str]:
    """(module, what it reads) -> its test, from the table under `SECTION` in docs/facts.md."""
    text = (ROOT / "docs" / "facts.md").read_text()
    body = text[text.index(SECTION) :].split("\n## ", 1)[0]
    rows = {}
    for line in body.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("trainer/"):
            rows[(cells[0], cells[1])] = cells[3]
    return rows


def _scan(root: pathlib.Path = ROOT) -> set[tuple[str, str]]:
    """(module, what it reads) for every `x._name` on an object not of towerflow's (a name `trainer/` never
    defines) and every import of a private module, in `root/trainer/`."""
    trees = {p.relative_to(root).as_posix(): ast.parse(p.read_text()) for p in sorted((root / "trainer").rglob("*.py"))}
    own = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                own.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                own.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
    found = set()
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and re.fullmatch(r"_[^_].*", node.attr):
                base = ast.unparse(node.value)
                if (
                    base not in ("self", "cls")
                    and node.attr not in own
                    and f"{base}.{node.attr}" not in PUBLIC_PRIVATES
                ):
                    found.add((path, "." + node.attr))
            modules = []
            if isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            found |= {(path, m) for m in modules if m.startswith(PRIVATE_MODULES)}
    return found


def test_trainer_reads_only_the_private_apis_facts_md_lists():
    found, listed = _scan(), set(_table())
    assert found - listed == set(), "private API read in trainer/ but not in docs/facts.md's table"
    assert listed - found == set(), "rows of docs/facts.md's table that trainer/ no longer reads"
    assert len(listed) == 4


def test_each_row_names_a_test_that_exists():
    for test in _table().values():
        path, name = test.split("::")
        assert re.search(rf"^def {name}\(", (ROOT / path).read_text(), re.M), test


def test_the_scan_finds_a_private_read_and_a_private_import(tmp_path):
    """The scan itself: a Keras private read and a `keras.src` import are found, towerflow's own are not."""
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "probe.py").write_text(
        "from keras.src import ops\n\n\nclass Mode:\n    def __init__(self):\n        self._micro_batch = ops\n\n\n"
        "def f(optimizer, mode):\n    return optimizer._iterations, mode._micro_batch, os._exit\n"
    )
    assert _scan(tmp_path) == {("trainer/probe.py", "keras.src"), ("trainer/probe.py", "._iterations")}


def test_traffic_follows_a_cond_into_its_branch():
    """`trainer.step.transfers.traffic` walks a cond's true branch (`op._true_graph`): the bytes its ops pull to
    another device count."""
    from trainer.step.transfers import traffic

    @tf.function
    def step(x, pred):
        def moved():
            with tf.device("/device:CPU:1"):
                return x * 2.0

        return tf.cond(pred, moved, lambda: x)

    graph = step.get_concrete_function(tf.TensorSpec((100,), tf.float32), tf.TensorSpec((), tf.bool)).graph
    counted = traffic.count(graph, "/device:CPU:0", argument_devices=["/device:CPU:0", "/device:CPU:0"])
    assert counted.received.get("CPU:1") == 400  # x, 100 float32, into the branch's multiply


def test_the_checkpoint_state_file_is_read_as_tensorflow_writes_it(tmp_path):
    """`checkpoint_files` parses and writes TensorFlow's state file with its proto (`checkpoint_state_pb2`)."""
    from trainer.outputs import checkpoint_files

    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(1.0)), str(tmp_path), max_to_keep=3)
    manager.save(), manager.save()
    state, problem = checkpoint_files.read_state(str(tmp_path))
    assert (state.names, problem) == (["ckpt-1", "ckpt-2"], "") and len(state.timestamps) == 2
    checkpoint_files.write_state(str(tmp_path), ["ckpt-1"], state.timestamps)
    assert tf.train.get_checkpoint_state(str(tmp_path)).model_checkpoint_path.endswith("ckpt-1")


def test_op_determinism_is_switched_off_again():
    """`determinism.configure` turns op determinism on, then off again (`tensorflow.python.framework.config`):
    `tf.timestamp` is refused only while it is on."""
    from trainer.system import determinism

    determinism.configure(0, deterministic=True)
    try:
        with pytest.raises(tf.errors.FailedPreconditionError):
            tf.timestamp()
    finally:
        determinism.configure(0, deterministic=False)
    assert float(tf.timestamp()) > 0


def test_onednn_is_read_back():
    """`runtime.describe()` reads whether oneDNN is on in the process (`_pywrap_util_port.IsMklEnabled`)."""
    code = "from trainer.system import runtime; print(runtime.describe()['onednn_enabled'])"
    seen = []
    for switch in ("0", "1"):
        env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": switch, "TF_CPP_MIN_LOG_LEVEL": "3"}
        run = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr[-2000:]
        seen.append(run.stdout.split()[-1])
    assert seen == ["False", "True"]
