"""`python -m benchmarks.worker --devices=N [--deterministic]`: builds sides and times windows on request.

One worker holds what is process-wide in TensorFlow: the number of logical CPU devices (fixed before the
first op) and op determinism. Two MirroredStrategy objects with different device counts cannot share a
process, and a deterministic side cannot share one with a default side without changing it (kernels read
the determinism switch when they run, not when they are traced), so the parent starts one worker per
(devices, deterministic) and alternates windows between workers when a figure's sides live in two.

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

    def __init__(self, num_devices: int, deterministic: bool):
        self.num_devices = num_devices
        self.deterministic = deterministic
        self.sides: dict = {}
        self.work_dir = tempfile.mkdtemp(prefix="towerflow-bench-")

    def info(self) -> dict:
        import keras
        import tensorflow as tf

        from trainer import config

        return {
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
            "devices": [d.name for d in tf.config.list_logical_devices("CPU")],
            "update_modes": list(config.UPDATE_MODES),
        }

    def build(self, side_id: str, side: dict, setting: dict, records: dict, trace_steps: int) -> dict:
        """Builds a side and runs its first window (`trace_steps` steps), which traces its step functions."""
        from benchmarks.plan import Setting, Side
        from benchmarks.sides import make_side

        side = Side(**side)
        if side.session_key != (self.num_devices, self.deterministic):
            raise ValueError(f"{side} belongs in a worker with (devices, deterministic) = {side.session_key}")
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

    def drop(self, side_id: str) -> dict:
        self.sides.pop(side_id).close()
        return {}

    def close(self) -> None:
        for side in self.sides.values():
            side.close()
        shutil.rmtree(self.work_dir, ignore_errors=True)


def serve(server: Server, commands, replies) -> None:
    """Answers commands until "exit" or end of input; an exception becomes an error reply."""
    handlers = {"info": server.info, "build": server.build, "window": server.window}
    handlers.update(profile=server.profile, drop=server.drop)
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.worker", description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=1, help="logical CPU devices")
    parser.add_argument("--deterministic", action="store_true", help="hosts the sides with deterministic=True")
    args = parser.parse_args(argv)
    # SIGTERM (the parent was interrupted) unwinds like an error: sides closed, work directory removed.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    replies = _reply_stream()
    from trainer import devices  # imports TensorFlow

    devices.configure_logical_cpus(args.devices)  # before any op runs
    server = Server(args.devices, args.deterministic)
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
