"""What a run needs of the machine, checked before TensorFlow is imported (seconds), so that bad input fails at
once with one line naming the culprit (exit 2): a `--task` that names no task, a `--model_dir` that cannot be
written, data globs that match nothing or match a directory, records the task finds wrong (the language
model's train and eval records of two vocabularies), the digits cache's directory; with several tasks,
only this task's port held by another process (a chief failing before it connects could not tell its
workers, which would wait).

Each check raises `ConfigError`. The later checks (`data.list_files`, the run directory's lock, the gRPC
server) stay where they are: these only move the common failures before the slow imports. Imports no
TensorFlow.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import socket
import sys
import tempfile

import tasks as tasks_lib
from trainer.settings.config import ConfigError, RunConfig


def check(config: RunConfig, tasks) -> None:
    """Every check that applies to this task of `tasks` (a `launch.job.cluster.Cluster`).

    Raises:
      ConfigError: naming the flag, the path or the port, and what to change.
    """
    try:
        tasks_lib.check_name(config.task.name)
    except tasks_lib.TaskError as e:
        raise ConfigError(str(e)) from None
    if tasks.num_tasks > 1:  # the rest fails later on the chief, once connected, so its workers hear of it
        port_free(tasks)
        return
    writable_dir(config.loop.model_dir, "--model_dir")
    if config.data.train_data:
        record_files(config.data.train_data, "--train_data")
        record_files(config.data.eval_data, "--eval_data")
        task_records(config)
    else:
        from data.digits import default_cache_dir  # noqa: PLC0415 (numpy only)

        cache = default_cache_dir()
        writable_dir(os.path.dirname(cache), "the digits' cache TOWERFLOW_CACHE", exists_ok=cache)


def writable_dir(path: str, what: str, exists_ok: str = "") -> None:
    """Makes the directory `path` if need be and checks that a file can be created in it; `what` names it.
    With `exists_ok`, a directory that cannot be written is fine when `exists_ok` exists in it already."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{what}={path} is a file, not a directory; pass a directory")
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".towerflow-probe-")
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        if exists_ok and os.path.isdir(exists_ok):
            return
        if e.errno == errno.ENOTDIR:
            raise ConfigError(f"{what}={path}: a part of the path is a file, not a directory") from None
        doing = "cannot be written" if os.path.isdir(path) else "cannot be created"
        raise ConfigError(f"{what}={path} {doing}: {e.strerror}; pass a writable directory") from None


def record_files(pattern: str, flag: str) -> None:
    """Each local comma-separated glob of `pattern` matches at least one path, and no match is a directory
    (which the reader would take for a corrupt record). Globs of other file systems (`gs://`) are left to
    TensorFlow's reader."""
    for part in (p.strip() for p in pattern.split(",")):
        if not part or "://" in part:
            continue
        matches = sorted(glob.glob(part, include_hidden=True))
        if not matches:
            raise ConfigError(f"no files match {flag} pattern '{part}'; check the path (full pattern: '{pattern}')")
        directories = [m for m in matches if os.path.isdir(m)]
        if directories:
            raise ConfigError(
                f"{flag} pattern '{part}' matches the directory {directories[0]}, not a TFRecord file; narrow the "
                f"glob to the record files"
            )


def task_records(config: RunConfig) -> None:
    """What the task finds wrong with the records (the language model: train and eval of one vocabulary), a
    refusal; what it warns of, one stderr line each."""
    problem, warnings = tasks_lib.check_records(config)
    if problem:
        raise ConfigError(problem)
    for line in warnings:
        print(line, file=sys.stderr, flush=True)


def port_free(tasks) -> None:
    """This task's gRPC port can be listened on (another process does not hold it)."""
    host, _, port = tasks.address.rpartition(":")
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does: a TIME_WAIT is no holder
        try:
            probe.bind(("", int(port)))
            probe.listen(1)
        except OSError as e:
            role = "the chief" if tasks.is_chief else "a worker"
            origin = f", from {tasks.origin}" if tasks.origin else ""
            raise ConfigError(
                f"port {port} of task {tasks.task_index} ({role} at {tasks.address}{origin}) is in use by another "
                f"process ({e.strerror}); stop it, or give the tasks other ports (--cluster_port, TF_CONFIG)"
            ) from None
