"""`python -m benchmarks.harness.worker --devices=N [--deterministic] [--onednn=..] [--*_op_threads=T]`: builds sides
and times windows on request.

One worker holds what is process-wide in TensorFlow (`plan.SessionKey`): the number of logical CPU devices
(fixed before the first op), op determinism and the runtime options. Two MirroredStrategy objects with
different device counts cannot share a process, a deterministic side cannot share one with a default side
without changing it (kernels read the determinism switch when they run, not when they are traced), oneDNN is
chosen when TensorFlow is imported and thread pools when it starts; so the parent starts one worker per key
and alternates windows between workers when a figure's sides live in two. The runtime options are applied by
`trainer.system.runtime`, as `python -m trainer` applies them, and read back before the first reply.

Protocol: one JSON command per line on stdin, one JSON reply per line on the original stdout. Everything
else TensorFlow or Keras prints is sent to stderr, so it cannot corrupt a reply.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _reply_stream():
    """Returns a text stream on the original stdout and points fd 1 (and sys.stdout) at stderr."""
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return replies


class Server:
    """Holds the built sides of this worker and answers commands."""

    def __init__(self, key, runtime_config):
        self.key = key
        self.runtime_config = runtime_config
        self.sides: dict = {}
        self.work_dir = tempfile.mkdtemp(prefix="towerflow-bench-")

    def info(self) -> dict:
        import keras
        import tensorflow as tf

        from trainer.settings import config

        return {
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
            "devices": [d.name for d in tf.config.list_logical_devices("CPU")],
            "update_modes": list(config.UPDATE_MODES),
            "runtime": applied_runtime(self.runtime_config),
        }

    def build(self, side_id: str, side: dict, setting: dict, records: dict, trace_steps: int) -> dict:
        """Builds a side and runs its first window (`trace_steps` steps), which traces its step functions."""
        from benchmarks.harness.plan import Setting, Side
        from benchmarks.harness.side_factory import make_side

        side = Side(**side)
        if side.session_key != self.key:
            raise ValueError(f"{side} belongs in the worker of {side.session_key}, not of {self.key}")
        setting = Setting(**{**setting, "example_shape": tuple(setting["example_shape"])})
        work_dir = tempfile.mkdtemp(dir=self.work_dir)
        started = time.perf_counter()
        built = self.sides[side_id] = make_side(side, setting, records, work_dir)
        build_sec = time.perf_counter() - started
        built.window(trace_steps)
        return {"build_sec": build_sec, "trace_sec": time.perf_counter() - started - build_sec}

    def window(self, side_id: str, steps: int) -> dict:
        seconds, examples = self.sides[side_id].window(steps)
        return {"seconds": seconds, "examples": examples}

    def profile(self, side_id: str, steps: int, log_dir: str) -> dict:
        """Times one window under the TensorFlow profiler (trace written to `log_dir`)."""
        import tensorflow as tf

        tf.profiler.experimental.start(log_dir)
        try:
            seconds, examples = self.sides[side_id].window(steps)
        finally:
            tf.profiler.experimental.stop()
        return {"seconds": seconds, "examples": examples}

    def stats(self, side_id: str) -> dict:
        """What a side reports beyond its rate: the async mode's staleness over every update it ran."""
        return getattr(self.sides[side_id], "stats", dict)()

    def drop(self, side_id: str) -> dict:
        self.sides.pop(side_id).close()
        return {}

    def close(self) -> None:
        for side in self.sides.values():
            side.close()
        shutil.rmtree(self.work_dir, ignore_errors=True)


def applied_runtime(config) -> dict:
    """The runtime settings as TensorFlow reports them (`trainer.system.runtime.describe`, CPU part), after checking
    that each one asked for in `config` is in force: a benchmark of an option that silently did not apply
    would compare a process with itself.

    Raises:
      RuntimeError: a setting TensorFlow reports differently from `config`.
    """
    from trainer.system import runtime

    applied = {k: v for k, v in runtime.describe().items() if not k.startswith("gpu_")}
    wanted = {name: getattr(config, name) for name in ("inter_op_threads", "intra_op_threads")}
    wanted = {name: value for name, value in wanted.items() if value}
    if config.onednn != "auto":
        wanted["onednn_enabled"] = config.onednn == "on"
    wrong = {name: (value, applied[name]) for name, value in wanted.items() if applied[name] != value}
    if wrong:
        raise RuntimeError(f"runtime settings not in force (wanted, TensorFlow reports): {wrong}")
    return applied


def serve(server: Server, commands, replies) -> None:
    """Answers commands until "exit" or end of input; an exception becomes an error reply."""
    handlers = {"info": server.info, "build": server.build, "window": server.window}
    handlers.update(profile=server.profile, stats=server.stats, drop=server.drop)
    for line in commands:
        command = json.loads(line)
        name = command.pop("cmd")
        if name == "exit":
            break
        try:
            reply = {"ok": True, **handlers[name](**command)}
        except Exception:  # reported to the parent, which marks the figure failed and goes on
            reply = {"ok": False, "error": traceback.format_exc()}
        replies.write(json.dumps(reply) + "\n")


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.harness.worker", description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=1, help="logical CPU devices")
    parser.add_argument("--deterministic", action="store_true", help="hosts the sides with deterministic=True")
    parser.add_argument("--onednn", choices=("auto", "on", "off"), default="auto", help="as python -m trainer")
    parser.add_argument("--inter_op_threads", type=int, default=0, help="as python -m trainer (0: default)")
    parser.add_argument("--intra_op_threads", type=int, default=0, help="as python -m trainer (0: default)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = _args(argv)
    from benchmarks.harness.plan import SessionKey
    from trainer.settings.config import RuntimeConfig
    from trainer.system import runtime  # no TensorFlow yet

    key = SessionKey(args.devices, args.deterministic, args.onednn, args.inter_op_threads, args.intra_op_threads)
    runtime_config = RuntimeConfig(
        onednn=args.onednn, inter_op_threads=args.inter_op_threads, intra_op_threads=args.intra_op_threads
    )
    os.environ.update(runtime.environment(runtime_config, args.deterministic))  # read by TensorFlow's import
    # SIGTERM (the parent was interrupted) unwinds like an error: sides closed, work directory removed.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    replies = _reply_stream()
    from trainer.system import devices  # imports TensorFlow

    runtime.apply(runtime_config, args.deterministic)  # before any op, like devices
    devices.configure_logical_cpus(args.devices)
    server = Server(key, runtime_config)
    code = 0
    try:
        replies.write(json.dumps({"ok": True, **server.info()}) + "\n")
        serve(server, sys.stdin, replies)
    except BrokenPipeError:
        code = 1  # the parent is gone: nobody to answer, just clean up
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        server.close()
        with contextlib.suppress(OSError):
            replies.close()
    # Always leave through os._exit: TensorFlow's interpreter teardown takes seconds to minutes with many
    # functions traced (or hangs on a pipe the parent no longer reads); sides are closed, event files written.
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
