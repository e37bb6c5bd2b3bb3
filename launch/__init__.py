"""Slurm and cluster helpers: what the job's environment says about the tasks of a run."""
