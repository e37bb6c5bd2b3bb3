"""Throughput benchmarks: towerflow against the training loops a user would otherwise write.

`python -m benchmarks [--quick|--smoke] [--out FILE] [--only NAME,...]` prints one ratio per figure
(towerflow's examples/sec divided by the reference's). The parent process imports no TensorFlow: it starts
worker processes (`benchmarks.worker`), one per process-wide setting (logical device count, determinism),
and asks them for timed windows, alternating between the two sides of a figure. See `benchmarks/RESULTS.md`.
"""
