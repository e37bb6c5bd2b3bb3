"""Throughput benchmarks: towerflow against the training loops a user would otherwise write.

`python -m benchmarks [--quick|--smoke] [--out FILE] [--only NAME,...]` prints the headline table, one ratio
per figure (towerflow's examples/sec divided by the reference's); `figures.py` says what each figure compares.
The parent process imports no TensorFlow: it starts worker processes (`benchmarks.harness.worker`), one per
process-wide setting (logical device count, determinism), and asks them for timed windows, alternating
between the two sides of a figure.

    figures.py   the headline figures: which two sides, on which setting, against which target
    harness/     how a figure is run: plan, workers and sessions, sides and reference loops, timing, report
    input/       the input pipeline's figures, and `python -m benchmarks --input`
    machines/    `python -m benchmarks.machines NAME`: traffic per placement, several machines
    probes/      `python -m benchmarks.probes NAME`: one-off measurements that explain a figure
    results/     what was measured: RESULTS.md (the index), its pages, the raw JSON

Imports go one way: `harness/` imports nothing else of benchmarks/, `input/` only `harness/`, `figures.py` both;
`machines/`, `probes/` and `__main__.py` are on top, and nothing imports them
(tests/benchmarks/test_benchmarks.py checks it).
"""
