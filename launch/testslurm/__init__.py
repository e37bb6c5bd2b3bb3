"""A Slurm of one to three nodes on this one machine, for the tests and the benchmarks (root, apt): one node
(`local_slurm.py`, brought up by `tests/support/slurm_fixture.py` for the tests marked `slurm`), or N nodes, each a
slurmd in a network namespace of its own (`node_slurm.py`, `python -m launch.testslurm.node_slurm up|down|status|cut`;
`tests/support/node_fixture.py` for the tests marked `twonode`, and `benchmarks/machines/strategies/slurm.py`). Both
share packages, munge, config and daemon handling (`slurm_conf.py`, `slurm_daemons.py`); `netns.py` makes the
namespaces, also one per task for `tests/launch/test_wire.py` and `benchmarks/machines/wire.py`. `ports.py` hands out
free ports on 127.0.0.1 for the tasks of a run started as local processes (tests and benchmarks).

Installed with the rest (benchmarks/, which is installed, imports it), but nothing in `launch.job`,
`launch.submit` or `trainer/` imports it: a user's job never runs it (tests/test_layout.py).
"""
