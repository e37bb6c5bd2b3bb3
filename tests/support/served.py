"""The trainer's eval in a fresh process, for the tests that hold a SavedModel against it: a script that builds
the run of `sys.argv[1]` from its flags.txt, restores its final checkpoint as a resume would, and computes
`Evaluator.predictions()` (the towers, split and graph metrics.json's eval figures came from) into `outputs,
batches`. A test appends what it prints or saves."""

RESTORED_EVAL = r"""
import json, sys
import numpy as np
from absl import flags
from trainer.loop.build import build
from trainer.settings import flags as tf_flags

tf_flags.define_flags()
flags.FLAGS(["eval", f"--flagfile={sys.argv[1]}/flags.txt"])
trainer = build(tf_flags.config_from_flags(flags.FLAGS))
assert trainer.checkpointer.restore_latest() is not None
outputs, batches = trainer.evaluator.predictions()
"""
