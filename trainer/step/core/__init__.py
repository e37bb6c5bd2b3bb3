"""The step's core: one micro-batch on one tower (`micro_batch`), the fixed summation tree over micro-batches
and where its sums run (`tree`), the reduction of a step's results along it (`combine`), how many steps one
`tf.function` call runs (`calls`), and where each variable lives and is read (`spread`: its owner under
`--parameter_device=spread`). Every other folder of the step builds on it; it imports none of them."""
