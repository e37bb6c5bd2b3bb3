"""How the engine traces its graphs: every `tf.function` of towerflow's (the step and its in-graph loops, eval,
histograms, the replicas' copies) is made by `function`, without autograph, as Keras 3's own `fit` traces
its step (`tf.autograph.experimental.do_not_convert` in keras/src/backend/tensorflow/trainer.py).

The engine writes its graph control flow as TensorFlow ops (`tf.while_loop`, `tf.cond`), so autograph only
rewrote Python loops over towers and micro-batches that it leaves as they are. Transpiling that code was
most of a start's tracing: 4.5 of the 7.5 CPU-seconds a 2-step run spent after importing TensorFlow (280
functions converted, at every start and every requeue). The graphs are the same, and so are the bits.

A model's and a task's code called from the step runs unconverted too, as under Keras `fit`: control flow
that depends on a tensor's value is written with `tf.cond` / `keras.ops.cond` (docs/tasks.md). Python code
that branches on a tensor anyway ends the run with one line naming its function and file (`GraphCodeError`),
not TensorFlow's advice to decorate it with `@tf.function`.

The input pipelines are built the same way (`pipelines`): tf.data traces every function given to `map`,
`scan` or `interleave` and, left alone, converts it with autograph first: 7 functions in a 12-step digits run,
each leaving a generated source file in the temporary directory (the trainer leaves through
`os._exit`, past autograph's clean-up): 61,732 had gathered in the project machine's /tmp.
"""

from __future__ import annotations

import functools
import os
import traceback
from collections.abc import Callable

import keras
import tensorflow as tf

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Where a frame is not the user's: Python's own modules, TensorFlow, Keras and towerflow's packages.
_NOT_THEIRS = tuple(os.path.dirname(os.path.abspath(module.__file__)) + os.sep for module in (os, tf, keras)) + tuple(
    os.path.join(_ROOT, package) + os.sep for package in ("trainer", "data", "models", "tasks", "launch")
)


class GraphCodeError(ValueError):
    """Code run while a graph traces used a tensor's value as a Python value (a bool, an iteration)."""


def function(fn: Callable | None = None, **options) -> Callable:
    """`tf.function(fn, autograph=False, **options)`; also a decorator, bare or with options."""
    if fn is None:
        return lambda f: function(f, **options)
    return tf.function(_explained(fn), autograph=False, **options)


def pipelines(build: Callable) -> Callable:
    """`build` (a function that makes tf.data pipelines) wrapped so the functions it gives tf.data are traced
    as written, without autograph; a tensor used as a Python value raises `GraphCodeError`."""
    return _explained(tf.autograph.experimental.do_not_convert(build))


def _explained(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def traced(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except tf.errors.OperatorNotAllowedInGraphError as e:
            raise GraphCodeError(explain(e)) from e

    return traced


def explain(error: tf.errors.OperatorNotAllowedInGraphError) -> str:
    """One line: where (the innermost frame outside TensorFlow, Keras and the engine: a task's or a model's
    code), what TensorFlow refused, and how to write it instead."""
    codes = [frame.f_code for frame, _ in traceback.walk_tb(error.__traceback__)]
    theirs = [code for code in codes if not os.path.abspath(code.co_filename).startswith(_NOT_THEIRS)]
    where = f"{theirs[-1].co_qualname} in {theirs[-1].co_filename}" if theirs else "the model's or task's code"
    refused = str(error).split(". ")[0].replace("`", "").rstrip(".")
    return (
        f"{where}: {refused} while the step traces; towerflow traces its graphs without autograph, as Keras fit "
        "does: write control flow on a tensor's value as an op (tf.cond, keras.ops.cond, tf.where)"
    )
