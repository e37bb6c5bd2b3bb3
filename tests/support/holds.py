"""Holding a running trainer still (SIGSTOP) until a signal Slurm sends it is pending, then letting it go.

A job that must be interrupted mid-run (`scontrol requeue`, a preemption, the time-limit warning) raced its own
end: it had to train long enough that the signal, sent seconds after the test asked for it (or up to 30 s
late, for the time limit: slurmctld checks every 30 s), still landed before the last step. That cost minutes of
training per job and failed on a fast machine. Held at a step the test chose, the trainer does no work while it
waits, the signal waits in the kernel (/proc/PID/status: ShdPnd), and the run resumes to handle it at its next
step, as it would have handled it mid-step. Slurm may continue the process itself first (it sends SIGCONT
before the SIGTERM of a requeue or preemption); either way the hold ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time


def trainer_pids(model_dir, timeout_sec: float = 60.0) -> list[int]:
    """The pids of the live `python -m trainer --model_dir=MODEL_DIR` processes (the job's tasks), once there
    is one."""
    wanted = f"--model_dir={model_dir}".encode()
    deadline = time.monotonic() + timeout_sec
    while not (pids := [int(n) for n in os.listdir("/proc") if n.isdigit() and _is_trainer(int(n), wanted)]):
        assert time.monotonic() < deadline, f"no trainer with {wanted.decode()} after {timeout_sec} s"
        time.sleep(0.2)
    return pids


def _is_trainer(pid: int, wanted: bytes) -> bool:
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        python = os.path.basename(argv[0]).startswith(b"python")  # not srun, whose arguments hold the trainer's
        return python and b"trainer" in argv and wanted in argv and _state(pid) not in ("Z", "X", None)
    return False


def _status(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/status") as f:
            return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    except OSError:
        return {}


def _state(pid: int) -> str | None:
    state = _status(pid).get("State")
    return state.split()[0] if state else None


def pending(pid: int) -> set[int]:
    """Signals pending for the process (ShdPnd) or its main thread (SigPnd)."""
    status = _status(pid)
    mask = int(status.get("ShdPnd", "0"), 16) | int(status.get("SigPnd", "0"), 16)
    return {number for number in range(1, 65) if mask >> (number - 1) & 1}


@contextlib.contextmanager
def stopped(pids: list[int]):
    """The processes `pids` stopped (SIGSTOP) for the `with` body, continued (SIGCONT) after it."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 30
        while any(_state(pid) not in ("T", None) for pid in pids):  # stopped (or gone)
            assert time.monotonic() < deadline, f"processes {pids} did not stop"
            time.sleep(0.05)
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


@contextlib.contextmanager
def held(pids: list[int], until: signal.Signals, timeout_sec: float = 120.0):
    """The processes `pids` stopped for the `with` body, which asks Slurm for a signal. On leaving, waits until
    `until` is pending for each, or Slurm continued it, or it is gone, or `timeout_sec` passed (the signal may
    have come just before the stop: the test's own assertions on the job then say what happened), and
    continues them."""
    with stopped(pids):
        yield
        deadline = time.monotonic() + timeout_sec
        while any(until not in pending(p) and _state(p) == "T" for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
