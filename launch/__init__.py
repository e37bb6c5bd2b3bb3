"""Slurm around the trainer, in three rooms by who reads them (docs/architecture.md):

- `launch.job`: what a running job reads: the trainer (the tasks from Slurm's or TF_CONFIG's variables, the
  requeue rule) and the batch shell (`python -m launch.job.lost` after a multi-task step);
- `launch.submit`: the user's command, `python -m launch.slurm` (`launch/slurm.py`, which runs
  `launch.submit.slurm`): check the trainer's flags, render the sbatch script, submit it;
- `launch.testslurm`: a Slurm of one to three nodes on this machine (root, apt), for the tests and the
  benchmarks; a user's job never needs it.

The modules left at the top are names kept for commands: `slurm.py` (the documented launcher), `lost.py` and
`node_slurm.py` (the names before the rooms: a queued job's batch script calls `launch.lost`).
"""
