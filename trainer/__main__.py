"""`python -m trainer`: flags -> RunConfig -> train. The only place that reads absl FLAGS.

Flags are validated before TensorFlow is imported (which takes seconds), so bad input fails at once.
"""

from __future__ import annotations

import dataclasses
import os
import sys

from absl import app, flags, logging

# TensorFlow's C++ INFO lines (CUDA stubs, CPU features) bury the training log; warnings still show.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

from launch import cluster
from trainer import config as cfg
from trainer import flags as tf_flags

tf_flags.define_flags()
FLAGS = flags.FLAGS


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])} (flags take the form --name=value)")
    try:
        config = tf_flags.config_from_flags(FLAGS)
        cluster.require_single_task(os.environ)
    except ValueError as e:  # ConfigError, or a multi-task job
        print(f"error: {e}", file=sys.stderr)
        return 2
    logging.set_verbosity(logging.WARNING)  # TensorFlow's Python INFO lines (saver, signatures) likewise
    config = dataclasses.replace(config, flags_text=tf_flags.flagfile_text(FLAGS, tf_flags.__name__))

    from data import DataError  # noqa: PLC0415 (deferred: keeps flag errors fast)
    from models import ModelError  # noqa: PLC0415
    from trainer.loop import StopRequested  # noqa: PLC0415
    from trainer.run import train  # noqa: PLC0415 (imports TensorFlow)

    try:
        train(config)
    except (cfg.ConfigError, DataError, ModelError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except StopRequested as e:
        print(str(e), file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    app.run(main)
