"""TensorFlow's own multi-machine strategies beside towerflow (`python -m benchmarks.machines peers`): the peers'
code as their tutorials write it (`mwms.py`, `ps.py`, `mwms.sbatch`), the processes both sides run in
(`cluster.py`), and each comparison (`sync.py`, `asynchronous.py`, `slurm.py`)."""
