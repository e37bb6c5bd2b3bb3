"""The real command line under signals: SIGHUP (terminal closed, ssh dropped) stops a run like SIGTERM, with a
checkpoint at the step it stopped and exit 75, and the rerun resumes to the weights of an uninterrupted run;
"rerun the same command" is said once; an attempt killed with SIGKILL is marked as such by the next start."""

import json
import re
import signal
import subprocess
import time

import pytest

from tests.support.paths import ROOT
from tests.support.runs import cpu_flags, run_trainer, trainer_command
from trainer.system import stop as stop_lib

FLAGS = cpu_flags(
    global_batch_size=64,
    deterministic=True,
    train_steps=400,
    log_every_steps=1,
    eval_every_steps=0,
    checkpoint_every_steps=20,
    histogram_every_steps=0,
    export=False,
)


def _start(model_dir):
    """The trainer as started from a terminal: SIGHUP at its default, whatever this process does with it (a
    pytest-xdist worker ignores it, and the trainer rightly leaves an inherited SIG_IGN alone, as under nohup)."""
    return subprocess.Popen(
        trainer_command(*FLAGS, f"--model_dir={model_dir}"),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
    )


def _until_step(process, step: int) -> str:
    """Reads the output until the log line of `step` (the run is mid-training); returns what it read."""
    read = ""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        read += line
        found = re.match(r"step\s+(\d+)/", line)
        if found and int(found.group(1)) >= step:
            return read
        assert line or process.poll() is None, read[-3000:]
    raise AssertionError(read[-3000:])


def _run(model_dir) -> subprocess.CompletedProcess:
    return run_trainer(*FLAGS, f"--model_dir={model_dir}")


def _sha(model_dir) -> str:
    return json.loads((model_dir / "metrics.json").read_text())["weights_sha256"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The weights of an uninterrupted run."""
    model_dir = tmp_path_factory.mktemp("reference") / "run"
    # Its weights only: without 400 log lines and 20 checkpoints (neither changes a weight).
    result = run_trainer(*FLAGS, "--log_every_steps=100", "--checkpoint_every_steps=0", f"--model_dir={model_dir}")
    assert result.returncode == 0, result.stderr[-2000:]
    return _sha(model_dir)


def test_sighup_checkpoints_exits_75_and_the_rerun_resumes_bitwise(tmp_path, reference):
    process = _start(tmp_path / "run")
    output = _until_step(process, 30)
    process.send_signal(signal.SIGHUP)
    output += process.communicate(timeout=120)[0]
    assert process.returncode == stop_lib.EXIT_RESUMABLE, output[-3000:]
    stopped = re.search(r"stopped by SIGHUP at step (\d+); checkpoint (\S+) saved", output)
    assert stopped, output[-3000:]
    step = int(stopped.group(1))
    assert 30 <= step < 400 and stopped.group(2).endswith(f"ckpt-{step}")
    assert len(re.findall("rerun the same command", output, re.IGNORECASE)) == 1, output[-2000:]
    attempts = json.loads((tmp_path / "run" / "attempts.json").read_text())
    assert attempts[0]["step"] == step and attempts[0]["outcome"] == f"stopped by signal 1 at step {step}"
    resumed = _run(tmp_path / "run")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"at step {step}" in resumed.stdout and "step     400/400" in resumed.stdout
    assert _sha(tmp_path / "run") == reference


def test_a_killed_attempt_is_marked_by_the_next_start(tmp_path, reference):
    process = _start(tmp_path / "run")
    _until_step(process, 45)  # past the checkpoint of step 40
    process.kill()
    process.communicate(timeout=60)
    before = json.loads((tmp_path / "run" / "attempts.json").read_text())
    assert before[0]["outcome"] == "running"
    checkpointed = before[0]["step"]
    assert checkpointed >= 40 and checkpointed % 20 == 0
    resumed = _run(tmp_path / "run")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed from {tmp_path / 'run' / 'checkpoints'}/ckpt-{checkpointed} at step {checkpointed}" in (
        resumed.stdout
    )
    after = json.loads((tmp_path / "run" / "attempts.json").read_text())
    assert after[0]["outcome"] == f"killed or lost (no end recorded; last checkpointed step {checkpointed})"
    assert after[1]["resumed_from_step"] == checkpointed and after[1]["outcome"] == "finished"
    assert _sha(tmp_path / "run") == reference


@pytest.mark.quick
def test_sighup_is_a_stop_signal_unless_ignored():
    assert signal.SIGHUP in stop_lib.STOP_SIGNALS
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    request = stop_lib.StopRequest()
    try:
        request.install()
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == request.handle
    finally:
        request.uninstall()
        signal.signal(signal.SIGHUP, previous)
