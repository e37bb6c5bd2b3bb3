"""benchmarks/probes/dtensor.py (issue #34, item 5): its comparison, its report of a check whose process dies, and
one check run for real on a tiny kernel (W = 8 over 2 logical CPUs)."""

import re
import subprocess
import sys

import numpy as np
import pytest

from benchmarks.harness import isolated
from benchmarks.probes import dtensor as probe
from tests.benchmarks.test_benchmark_probes import _run


@pytest.mark.quick
def test_compare_is_bitwise_and_reports_the_max_abs_difference():
    a = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    assert isolated.compare("c", "y", a, a.copy()) == isolated.row("c", "bits y", "equal", "max abs diff 0")
    b = a.copy()
    b[1, 0] = np.nextafter(np.float32(3.0), np.float32(4.0))  # one ulp at 3: 2**-22
    assert isolated.compare("c", "y", b, a) == isolated.row("c", "bits y", "differs", "max abs diff 2.38e-07")
    assert isolated.compare("c", "loss", np.float32(0.1), np.float32(0.1))["result"] == "equal"
    assert isolated.compare("c", "y", a, a.T[:1])["detail"] == "shape (2, 2) != (1, 2)"
    assert isolated.compare("c", "y", -0.0 * a, 0.0 * a)["result"] == "equal"  # array_equal: -0 == +0


@pytest.mark.quick
def test_failures_are_one_line_and_the_table_escapes_pipes():
    assert isolated.failure(ValueError("bad mesh\nsecond line")) == "ValueError: bad mesh"
    wrapped = RuntimeError(
        "in user code:\n\n    File x.py, line 3\n\n    RuntimeError: `unpack` must be called eagerly.\n"
    )
    assert isolated.failure(wrapped) == "RuntimeError: `unpack` must be called eagerly."
    rows = [isolated.row("k", "a|b", "ok", "x | y")]
    assert isolated.table(rows) == [
        "| check | what | result | detail |",
        "|---|---|---|---|",
        "| k | a|b | ok | x / y |",
    ]


@pytest.mark.quick
def test_shard_counts_that_cannot_split_the_kernel_are_refused_in_one_line(capsys):
    for shards in ("3", "2,x", "1"):
        with pytest.raises(SystemExit) as exit_info:
            probe.main(["--width=8", f"--shards={shards}"])
        assert exit_info.value.code == 2
        error = capsys.readouterr().err.splitlines()[-1]
        assert error.endswith(f"--shards={shards}: give counts > 1 that divide 4 * --width (32), e.g. 2,4"), error


@pytest.mark.quick
def test_a_check_whose_process_dies_is_a_row_not_the_end_of_the_probe():
    python = sys.executable
    aborted = isolated.run_isolated("c", [python, "-c", "import os, sys; print('dying', file=sys.stderr); os.abort()"])
    assert aborted == [isolated.row("c", "process", "failed", "killed by SIGABRT: dying")]
    exited = isolated.run_isolated("c", [python, "-c", "import sys; sys.exit(3)"])
    assert exited == [isolated.row("c", "process", "failed", "exit code 3: (no stderr)")]
    silent = isolated.run_isolated("c", [python, "-c", "print('no result line')"])
    assert silent == [isolated.row("c", "process", "failed", "exit code 0: (no stderr)")]
    rows = [isolated.row("c", "a", "ok", "fine")]
    printed = f"import json; print('noise'); print('RESULT ' + json.dumps({rows!r}))"
    assert isolated.run_isolated("c", [python, "-c", printed]) == rows
    with pytest.raises(subprocess.TimeoutExpired):
        isolated.run_isolated("c", [python, "-c", "import time; time.sleep(30)"], timeout=0.5)


def test_the_output_split_over_two_cpus_is_created_trained_and_bitwise():
    """The probe's own run at W = 8: every step works, the gradient is sharded like W, and y, dL/dW and the
    updated W have the bits of one device (no sum runs over the split dimension); the loss's, dL/dx's and the
    softmax's sums do."""
    out = _run("-m", "benchmarks.probes", "dtensor", "--width=8", "--shards=2", "--checks=sharded:output")
    assert out.splitlines()[0].startswith("TensorFlow 2.21") and "kernel [8, 32]" in out.splitlines()[0]
    rows = {r[1]: (r[2], r[3]) for r in re.findall(r"^\| (sharded:output:2) \| (.+?) \| (\w+) \| (.*) \|$", out, re.M)}
    steps = ["a. mesh + sharded DVariable (pack)", "b. y, loss, gradients in a tf.function", "c. SGD update"]
    bits = ["bits y", "bits loss", "bits dL/dW", "bits dL/dx", "bits dL/dW, softmax cross-entropy",
            "bits W after update", "bits b. run twice"]  # fmt: skip
    assert list(rows) == steps + bits
    assert rows["a. mesh + sharded DVariable (pack)"] == ("ok", "W (8, 32) layout ['unsharded', 'x']")
    assert rows["b. y, loss, gradients in a tf.function"][0] == "ok"
    assert "dL/dW ['unsharded', 'x'] (sharded like W: True)" in rows["b. y, loss, gradients in a tf.function"][1]
    assert rows["c. SGD update"] == ("ok", "W ['unsharded', 'x']")
    for quantity in ("y", "dL/dW", "W after update"):
        assert rows[f"bits {quantity}"] == ("equal", "max abs diff 0"), quantity
    assert rows["bits b. run twice"] == ("equal", "all of b.")  # op determinism holds on the mesh
    # reordered sums: equal only by luck, and then with no difference at all
    for quantity in ("loss", "dL/dx", "dL/dW, softmax cross-entropy"):
        result, detail = rows[f"bits {quantity}"]
        assert (result == "equal") == (detail == "max abs diff 0") and 0 <= float(detail.split()[-1]) < 1e-5
