"""The step's core: one micro-batch on one tower (`micro_batch`), the fixed summation tree over micro-batches
and where its sums run (`tree`), the reduction of a step's results along it (`combine`), and how many steps one
`tf.function` call runs (`calls`). Both update modes build on it."""
