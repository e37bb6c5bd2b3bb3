"""Parent side of the worker protocol: start workers, build sides in them, ask for windows.

A worker's stderr (TensorFlow's log) goes to a file, shown in the error when the worker fails.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

from benchmarks.harness import paths
from benchmarks.harness.plan import SessionKey, Setting, Side

_LOG_TAIL_CHARS = 4000


def side_id(side: Side, setting: Setting) -> str:
    """The key a built side is known by in its worker."""
    return json.dumps([dataclasses.asdict(side), setting.name], sort_keys=True)


def worker_command(key: SessionKey) -> list[str]:
    """The command line of the worker for `key` (benchmarks/harness/worker.py applies it before the first op)."""
    command = [sys.executable, "-m", "benchmarks.harness.worker", f"--devices={key.devices}", f"--onednn={key.onednn}"]
    command += [f"--inter_op_threads={key.inter_op_threads}", f"--intra_op_threads={key.intra_op_threads}"]
    return command + (["--deterministic"] if key.deterministic else [])


class WorkerError(RuntimeError):
    """A command failed in a worker, or the worker died; the message holds its traceback or log tail."""


class Session:
    """One worker process, started with the process-wide state of `key` (devices, determinism, runtime)."""

    def __init__(self, key: SessionKey, log_dir: str):
        self.key = key
        self.log_path = os.path.join(log_dir, f"worker-{key.describe()}.log")
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                worker_command(key),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                cwd=paths.REPO_ROOT,
            )
        self.built: set[str] = set()
        self.info: dict | None = None

    def ready(self) -> dict:
        """Waits for the worker's first line (TensorFlow imported, devices configured); returns its info."""
        if self.info is None:
            self.info = self._read()
        return self.info

    def call(self, cmd: str, **fields) -> dict:
        """Sends one command and returns its reply. Raises WorkerError when it failed."""
        self.send(cmd, **fields)
        return self.receive()

    def send(self, cmd: str, **fields) -> None:
        """Sends a command without waiting: replies come back in order, through `receive`."""
        self.ready()
        try:
            self.process.stdin.write(json.dumps({"cmd": cmd, **fields}) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            raise WorkerError(f"worker {self.key} is gone:\n{self._log_tail()}") from None

    def receive(self) -> dict:
        return self._read()

    def send_build(self, side: Side, setting: Setting, records: dict, trace_steps: int) -> str | None:
        """Sends the build of `side` (its reply must then be received) unless it is built; returns its id,
        or None when there is nothing to receive."""
        key = side_id(side, setting)
        if key in self.built:
            return None
        fields = {"side": dataclasses.asdict(side), "setting": dataclasses.asdict(setting), "records": records}
        self.send("build", side_id=key, trace_steps=trace_steps, **fields)
        self.built.add(key)  # a failed build is discarded again by `receive_build`
        return key

    def receive_build(self, key: str) -> dict:
        try:
            return self.receive()
        except WorkerError:
            self.built.discard(key)
            raise

    def build(self, side: Side, setting: Setting, records: dict, trace_steps: int) -> str:
        """Builds and traces `side` for `setting` unless this worker already has it; returns its id."""
        key = self.send_build(side, setting, records, trace_steps)
        if key is not None:
            self.receive_build(key)
        return side_id(side, setting)

    def drop(self, side: Side, setting: Setting) -> None:
        """Frees a built side (an async side's tower threads stop)."""
        key = side_id(side, setting)
        if key in self.built and self.alive():
            self.call("drop", side_id=key)
        self.built.discard(key)

    def alive(self) -> bool:
        return self.process.poll() is None

    def request_exit(self) -> None:
        if self.alive():
            try:
                self.process.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
                self.process.stdin.close()
            except BrokenPipeError:
                pass

    def wait(self, timeout_sec: float = 60) -> None:
        try:
            self.process.wait(timeout=timeout_sec)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            self.process.wait()
            raise WorkerError(f"worker {self.key} exited ({self.process.returncode}):\n{self._log_tail()}")
        reply = json.loads(line)
        if not reply.pop("ok"):
            raise WorkerError(reply["error"])
        return reply

    def _log_tail(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()[-_LOG_TAIL_CHARS:]


class Sessions:
    """The workers of a run, by SessionKey; a dead one is replaced on next use."""

    def __init__(self, log_dir: str):
        self.log_dir = log_dir
        self.sessions: dict[SessionKey, Session] = {}

    def start(self, keys) -> None:
        """Starts the workers for `keys` at once, so their TensorFlow imports overlap."""
        for key in keys:
            self.get(key, wait=False)

    def get(self, key: SessionKey, wait: bool = True) -> Session:
        session = self.sessions.get(key)
        if session is None or not session.alive():
            session = self.sessions[key] = Session(key, self.log_dir)
        if wait:
            session.ready()
        return session

    def pids(self) -> list[int]:
        """This process and its live workers: the run's own CPU use (load.py). A worker that ended was waited
        for, so its CPU time is this process's children's."""
        return [os.getpid(), *(session.process.pid for session in self.sessions.values() if session.alive())]

    def info(self) -> dict:
        """Versions and update modes, from any worker (the parent imports no TensorFlow)."""
        return next(iter(self.sessions.values())).ready() if self.sessions else {}

    def close(self, graceful: bool = True) -> None:
        """Asks every worker to exit, then waits for all (their shutdowns overlap). Not `graceful` (the run
        was interrupted): SIGTERM at once, instead of after the commands already queued (builds, a window)."""
        for session in self.sessions.values():
            if graceful:
                session.request_exit()
            elif session.alive():
                session.process.terminate()
        for session in self.sessions.values():
            session.wait()
