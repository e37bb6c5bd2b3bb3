"""The user's side of Slurm, before the job: `slurm.py` checks the trainer's flags as `python -m trainer` would
(without TensorFlow), renders the job's sbatch script (`sbatch.py`) into MODEL_DIR/slurm/ and submits it. Run as
`python -m launch.slurm` (`launch/submit/slurm.py`); the tests, `tests/support/node_jobs.py` and the Slurm benchmarks
(`benchmarks/machines/strategies/slurm.py`) submit through that command too.
"""
