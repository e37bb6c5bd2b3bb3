"""What a task's records are checked for before the model sees them (docs/data.md, docs/tasks.md): a key the
task reads and a record lacks (unless `optional`), a value outside a feature's `bounds`, an index the model's
lookup refuses when no bounds are declared, and a model whose outputs change with its padding (a warning).

In process: the Feature declaration and the full check (`check_feature_records`). Through `python -m trainer`
subprocesses (the helpers of tests/tasks/test_task_errors.py): each refused run is one `error:` line on stderr and
exit 2; the padding check is one `warning:` line, or none for a model that masks its padding.
"""

from __future__ import annotations

import concurrent.futures
import glob
import os

import pytest

import data
from data.schema import Feature
from tests.support import tasks_example
from tests.tasks.test_task_errors import _run

TOKENS = {"tokens": Feature("int64", max_length=16), "y": Feature("float32")}
BAD = 37  # the training record holding an id of 40, past VOCAB (32), or lacking its tokens
BAD_EVAL = 3


def _write(path: str, examples: list[dict], features: dict) -> str:
    data.write_feature_records(path, examples, data.FeatureSchema.of(features, "writer"))
    return path


def _with_id(examples: list[dict], index: int, value: int = 40) -> list[dict]:
    examples = list(examples)
    examples[index] = {"tokens": [1, 2, value], "y": [0.5]}
    return examples


@pytest.mark.quick
@pytest.mark.parametrize(
    ("declared", "message"),
    [
        (dict(dtype="int64", optional=True), "a fixed feature cannot be optional"),
        (
            dict(dtype="string", max_length=4, bounds=(0, 1)),
            "bounds (0, 1): only an int64 or float32 feature has bounds",
        ),
        (dict(dtype="int64", bounds=(5, 5)), "bounds (5, 5) must be two ints (low, high) with low < high"),
        (dict(dtype="int64", bounds=(0, 2.5)), "bounds (0, 2.5) must be two ints"),
        (dict(dtype="float32", bounds=(0,)), "bounds (0,) must be two numbers"),
    ],
)
def test_a_feature_declaration_that_cannot_hold_is_refused(declared, message):
    with pytest.raises(data.DataError, match=r"^" + message.replace("(", r"\(").replace(")", r"\)")):
        Feature(**declared)
    assert Feature("float32", bounds=[0, 1]).bounds == (0.0, 1.0)
    assert Feature("int64", max_length=3, optional=True, bounds=(0, 256)).bounds == (0, 256)


@pytest.mark.quick
def test_the_full_check_names_a_later_record_that_lacks_a_key_or_leaves_the_bounds(tmp_path):
    schema = data.FeatureSchema.of({**TOKENS, "tokens": Feature("int64", max_length=16, bounds=(0, 32))}, "demo")
    good = tasks_example.token_examples(20, seed=0)
    empty = [*good[:5], {"tokens": [], "y": [0.5]}, *good[5:]]  # present and empty: fine, optional or not
    path = _write(str(tmp_path / "empty.tfrecord"), empty, TOKENS)
    assert data.check_feature_records(data.inspect_feature_records(path, schema), what="--eval_data") == 21
    lacking = _write(str(tmp_path / "lacking.tfrecord"), good[:7], TOKENS)
    _write(str(tmp_path / "tail.tfrecord"), [{"y": [0.5]}], {"y": Feature("float32")})
    with open(lacking, "ab") as f, open(tmp_path / "tail.tfrecord", "rb") as tail:
        f.write(tail.read())  # record 7 holds only y
    outside = _write(str(tmp_path / "outside.tfrecord"), _with_id(good, 12, value=-1), TOKENS)
    expected = {
        lacking: f"task 'demo': feature 'tokens' of {lacking} record 7 is missing (keys found: y); if records may "
        "lack it, declare it Feature(..., optional=True) (--eval_data)",
        outside: f"task 'demo': feature 'tokens' of {outside} record 12 holds -1, outside its bounds [0, 32) "
        "(--eval_data)",
    }
    for path, line in expected.items():
        with pytest.raises(data.DataError) as raised:
            data.check_feature_records(data.inspect_feature_records(path, schema), what="--eval_data")
        assert str(raised.value) == line
    first = _write(str(tmp_path / "first.tfrecord"), _with_id(good, 0), TOKENS)  # each file's first: at inspection
    with pytest.raises(data.DataError) as raised:
        data.inspect_feature_records(first, schema)
    assert str(raised.value) == f"task 'demo': feature 'tokens' of {first} holds 40, outside its bounds [0, 32)"
    optional = data.FeatureSchema.of({**TOKENS, "tokens": Feature("int64", max_length=16, optional=True)}, "demo")
    assert data.check_feature_records(data.inspect_feature_records(lacking, optional)) == 8


def _cases(base: str) -> dict:
    """{name: (flags, expected exit code, expected stderr)}, the files written under `base`."""
    good = tasks_example.token_examples(60, seed=1)
    train = _write(f"{base}/train.tfrecord", good, TOKENS)
    evaluation = _write(f"{base}/eval.tfrecord", tasks_example.token_examples(20, seed=2), TOKENS)
    renamed = [{"token": e["tokens"], "y": e["y"]} for e in good]
    typo = _write(f"{base}/typo.tfrecord", renamed, {"token": TOKENS["tokens"], "y": TOKENS["y"]})
    dense = [{"xs": e["x"], "y": e["y"]} for e in tasks_example.examples(40, 0)]
    fixed_typo = _write(f"{base}/xs.tfrecord", dense, {"xs": Feature("float32", shape=(8,)), "y": Feature("float32")})
    bad_train = _write(f"{base}/bad-train.tfrecord", _with_id(good, BAD), TOKENS)
    bad_eval = _write(f"{base}/bad-eval.tfrecord", _with_id(tasks_example.token_examples(20, seed=2), BAD_EVAL), TOKENS)
    task = "--task=tests.support.tasks_example:"
    data_flags = lambda t, e=evaluation: [f"--train_data={t}", f"--eval_data={e}"]  # noqa: E731
    return {
        "typo_variable": (
            [f"{task}Tokens", *data_flags(typo)],
            2,
            f"error: task 'tokens': feature 'tokens' of {typo} is missing (keys found: token, y); if records may "
            "lack it, declare it Feature(..., optional=True)\n",
        ),
        "typo_fixed": (
            [f"{task}Regression", *data_flags(fixed_typo, fixed_typo)],
            2,
            f"error: task 'regression': feature 'x' of {fixed_typo} is missing (keys found: xs, y)\n",
        ),
        "optional_absent": ([f"{task}OptionalTags", *data_flags(train)], 0, ""),
        "out_of_bounds_train": (
            [f"{task}BoundedTokens", *data_flags(bad_train)],
            2,
            f"error: --train_data task 'tokens': feature 'tokens' of {bad_train} record {BAD} holds 40, outside its "
            "bounds [0, 32)\n",
        ),
        "out_of_bounds_eval": (
            [f"{task}BoundedTokens", *data_flags(train, bad_eval)],
            2,
            f"error: task 'tokens': feature 'tokens' of {bad_eval} record {BAD_EVAL} holds 40, outside its bounds "
            "[0, 32) (--eval_data)\n",
        ),
        "lookup_without_bounds": (
            [f"{task}Tokens", *data_flags(bad_train)],
            2,
            "error: task 'tokens': the model looked up 40, outside its table [0, 32), in a batch of --train_data; a "
            "record's 'tokens' may hold it: declare the feature's range, Feature(..., bounds=(0, 32)), to have the "
            "record named before the model sees it\n",
        ),
        "padding_masked": ([f"{task}Tokens", *data_flags(train)], 0, ""),
        "padding_seen": ([f"{task}MeanOverPadding", *data_flags(train)], 0, None),  # the warning: see its test
    }


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """{case: (CompletedProcess, expected code, expected stderr, model_dir)}, every case run once."""
    base = tmp_path_factory.mktemp("feature_checks")
    runs = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        for name, (flags, code, stderr) in _cases(str(base)).items():
            model_dir = str(base / name)
            runs[name] = (pool.submit(_run, flags, model_dir), code, stderr, model_dir)
        return {name: (future.result(), *rest) for name, (future, *rest) in runs.items()}


@pytest.mark.parametrize(
    "case",
    [
        "typo_variable",
        "typo_fixed",
        "optional_absent",
        "out_of_bounds_train",
        "out_of_bounds_eval",
        "lookup_without_bounds",
        "padding_masked",
    ],
)
def test_each_case_ends_with_its_exit_code_and_exactly_its_stderr(results, case):
    done, code, stderr, model_dir = results[case]
    assert (done.returncode, done.stderr) == (code, stderr), done.stdout[-2000:]
    if case in ("typo_variable", "typo_fixed", "out_of_bounds_eval"):  # refused before the first step
        assert "fresh start at step 0" not in done.stdout
        assert not glob.glob(os.path.join(model_dir, "ckpt*")) and not os.path.exists(f"{model_dir}/checkpoint")
    if case in ("out_of_bounds_train", "lookup_without_bounds"):  # found while training
        assert "fresh start at step 0" in done.stdout, done.stdout


def test_a_model_that_pools_over_its_padding_is_warned_about_once(results):
    done, _, _, _ = results["padding_seen"]
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    prefix = "warning: task 'tokens': the model's output for one example changes with its padding (max difference "
    assert lines[0].startswith(prefix), lines
    assert lines[0].endswith(" between lengths 8 and 16); mask the padded positions: docs/tasks.md#padding"), lines
