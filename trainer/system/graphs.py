"""How the engine traces its graphs: every `tf.function` of towerflow's (the step and its in-graph loops, eval,
histograms, the replicas' copies) is made by `function`, without autograph, as Keras 3's own `fit` traces
its step (`tf.autograph.experimental.do_not_convert` in keras/src/backend/tensorflow/trainer.py).

The engine writes its graph control flow as TensorFlow ops (`tf.while_loop`, `tf.cond`), so autograph only
rewrote Python loops over towers and micro-batches that it leaves as they are. Transpiling that code was
most of a start's tracing: 4.5 of the 7.5 CPU-seconds a 2-step run spent after importing TensorFlow (280
functions converted, at every start and every requeue). The graphs are the same, and so are the bits.

A model's and a task's code called from the step runs unconverted too, as under Keras `fit`: control flow
that depends on a tensor's value is written with `tf.cond` / `keras.ops.cond` (docs/tasks.md).
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf


def function(fn: Callable | None = None, **options) -> Callable:
    """`tf.function(fn, autograph=False, **options)`; also a decorator, bare or with options."""
    if fn is None:
        return lambda f: tf.function(f, autograph=False, **options)
    return tf.function(fn, autograph=False, **options)
