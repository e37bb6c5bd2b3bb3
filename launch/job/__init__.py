"""What a running Slurm job reads, without TensorFlow: the tasks of a run from Slurm's or TF_CONFIG's variables
(`cluster.py`, read by `trainer/__main__.py`, `trainer/loop/run.py`, `trainer/system/distributed.py`), the
requeue rule, `scontrol requeue` and the words of attempts.json (`requeue.py`, read by
`trainer/outputs/attempts.py` and by `lost.py`), and the batch shell's tool after a multi-task step
(`lost.py`, `python -m launch.job.lost`, which the scripts of `launch.submit.sbatch` call).
"""
