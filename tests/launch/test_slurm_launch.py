"""launch.submit.sbatch / launch.slurm: the rendered job script and the launcher's checks (no Slurm needed)."""

import os
import sys

import pytest

from launch.submit import sbatch
from launch.submit import slurm as launcher

pytestmark = pytest.mark.quick  # the development subset: fast, and covers this file's checks


@pytest.mark.parametrize(
    "text, seconds",
    [("90", 5400), ("5:30", 330), ("01:00:00", 3600), ("2-00", 172800), ("1-02:03", 93780), ("1-0:0:5", 86405)],
)
def test_slurm_time_formats(text, seconds):
    assert sbatch.parse_time_sec(text) == seconds


@pytest.mark.parametrize("time_sec, warning", [(None, 300), (60, 30), (120, 60), (600, 90), (3600, 180), (86400, 300)])
def test_default_warning_leaves_room_for_a_step_and_a_checkpoint(time_sec, warning):
    assert sbatch.default_warning_sec(time_sec) == warning


def _render(capsys, *argv):
    """Runs the launcher with --dry_run added before `--`; returns (exit code, stdout, stderr)."""
    split = argv.index("--")
    code = launcher.main([*argv[:split], "--dry_run", *argv[split:]])
    out, err = capsys.readouterr()
    return code, out, err


def _srun_line(script: str) -> str:
    """The line of a multi-task script that runs the step (the batch shell goes on after it)."""
    (line,) = [line for line in script.splitlines() if line.startswith("srun ")]
    assert line.endswith(" &")  # in the background: launch.job.lost waits for it, then may requeue
    return line.removesuffix(" &")


def _sbatch_lines(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]


def test_cpu_job_asks_for_no_gpu_and_execs_the_trainer(capsys, tmp_path):
    code, out, _ = _render(
        capsys, f"--model_dir={tmp_path}/run", "--time=00:02:00", "--cpus_per_task=2", "--", "--device=cpu"
    )
    assert code == 0
    assert _sbatch_lines(out) == [
        "--job-name=towerflow-run",
        f"--output={tmp_path}/run/slurm/%x-%j.log",
        "--open-mode=append",
        "--requeue",
        "--nodes=1",
        "--signal=B:USR1@60",
        "--cpus-per-task=2",
        "--time=00:02:00",
    ]
    exec_line = out.strip().splitlines()[-1]
    assert exec_line == (
        f"exec {sys.executable} -u -m trainer --model_dir={tmp_path}/run --max_requeues=3 --device=cpu"
    )
    assert f"cd {os.getcwd()}" in out.splitlines()
    assert "srun" not in out  # one task: the trainer itself is the batch task, exactly as before multi-task jobs
    assert not os.path.exists(tmp_path / "run")  # a dry run writes nothing


SRUN_COMMENT = "# 2 tasks run `python -m trainer` with the same flags; task 0 is the chief, the others serve it."


def test_two_nodes_srun_one_trainer_per_node_and_warn_every_task(capsys, tmp_path):
    code, out, _ = _render(
        capsys, f"--model_dir={tmp_path}/mn", "--nodes=2", "--cpus_per_task=8", "--time=04:00:00", "--", "--num_gpus=4"
    )
    assert code == 0
    assert _sbatch_lines(out) == [
        "--job-name=towerflow-mn",
        f"--output={tmp_path}/mn/slurm/%x-%j.log",
        "--open-mode=append",
        "--requeue",
        "--nodes=2",
        "--signal=USR1@300",  # no B:: every step task (the chief) gets it, not only the batch shell (srun)
        "--gres=gpu:4",
        "--cpus-per-task=8",
        "--time=04:00:00",
    ]
    assert _srun_line(out) == (
        f"srun --kill-on-bad-exit=1 --label --cpus-per-task=8 {sys.executable} -u -m trainer "
        f"--model_dir={tmp_path}/mn --max_requeues=3 --num_gpus=4"
    )
    assert SRUN_COMMENT in out


@pytest.mark.quick
def test_a_node_range_is_slurms_and_every_count_in_it_is_checked(capsys, tmp_path):
    """--nodes=2-4 with 24 micro-batches of 2 towers per node: 2, 3 and 4 nodes each split them evenly."""
    flags = ["--", "--device=cpu", "--num_gpus=2", "--micro_batches=24", "--global_batch_size=96"]
    code, out, _ = _render(capsys, f"--model_dir={tmp_path}/r", "--nodes=2-4", *flags)
    assert code == 0 and "--nodes=2-4" in _sbatch_lines(out)
    assert _srun_line(out).startswith("srun --kill-on-bad-exit=1 --label ")
    code, _, err = _render(capsys, f"--model_dir={tmp_path}/r", "--nodes=2-5", *flags)
    assert code == 2 and "on 5 of --nodes=2-5 nodes" in err and "these numbers of tasks do: 1, 2, 3, 4, 6, 12" in err


def test_two_tasks_on_one_node_share_its_gres_and_bind_their_own_gpus(capsys, tmp_path):
    code, out, _ = _render(capsys, f"--model_dir={tmp_path}/t2", "--tasks_per_node=2", "--", "--num_gpus=2")
    assert code == 0
    lines = _sbatch_lines(out)
    assert lines[4:] == ["--nodes=1", "--ntasks-per-node=2", "--signal=USR1@300", "--gres=gpu:4"]
    assert _srun_line(out) == (
        f"srun --kill-on-bad-exit=1 --label --gpu-bind=per_task:2 {sys.executable} -u -m trainer "
        f"--model_dir={tmp_path}/t2 --max_requeues=3 --num_gpus=2"
    )
    assert SRUN_COMMENT in out
    code, out, _ = _render(capsys, f"--model_dir={tmp_path}/t2", "--tasks_per_node=2", "--gpus_per_node=4", "--")
    assert code == 0 and "--gres=gpu:4" in _sbatch_lines(out) and _srun_line(out).endswith("--num_gpus=2")


def test_two_cpu_tasks_on_one_node(capsys, tmp_path):
    code, out, _ = _render(
        capsys, f"--model_dir={tmp_path}/c2", "--tasks_per_node=2", "--", "--device=cpu", "--micro_batches=2"
    )
    assert code == 0
    assert _sbatch_lines(out)[4:] == ["--nodes=1", "--ntasks-per-node=2", "--signal=USR1@300"]
    assert _srun_line(out) == (
        f"srun --kill-on-bad-exit=1 --label {sys.executable} -u -m trainer --model_dir={tmp_path}/c2 "
        f"--max_requeues=3 --device=cpu --micro_batches=2"
    )


def test_gpu_job_takes_gres_from_num_gpus_and_passes_extra_options(capsys, tmp_path):
    code, out, _ = _render(
        capsys,
        f"--model_dir={tmp_path}/r50",
        "--partition=gpu",
        "--account=lab",
        "--sbatch_arg=--qos=high",
        "--sbatch_arg=--array=0-3",
        "--max_requeues=5",
        "--warning_sec=240",
        "--",
        "--num_gpus=4",
        "--model=resnet50",
    )
    assert code == 0
    lines = _sbatch_lines(out)
    for expected in ("--gres=gpu:4", "--partition=gpu", "--account=lab", "--qos=high", "--array=0-3"):
        assert expected in lines
    assert "--signal=B:USR1@240" in lines and not any(line.startswith("--time") for line in lines)
    assert "--max_requeues=5 --num_gpus=4 --model=resnet50" in out


def test_gpus_per_node_fills_in_num_gpus_and_a_conflict_is_refused(capsys, tmp_path):
    code, out, _ = _render(capsys, f"--model_dir={tmp_path}/a", "--gpus_per_node=8", "--")
    assert code == 0 and "--gres=gpu:8" in _sbatch_lines(out) and out.rstrip().endswith("--num_gpus=8")
    code, _, err = _render(capsys, f"--model_dir={tmp_path}/a", "--gpus_per_node=8", "--", "--num_gpus=4")
    assert code == 2 and "--gpus_per_node (8) differs from the trainer's --num_gpus (4)" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--", "--num_gpu=2"], "Unknown command line flag 'num_gpu'"),
        (
            ["--", "--num_gpus=2", "--micro_batches=3"],
            "--micro_batches (3) must be a multiple of the towers (--num_gpus=2)",
        ),
        (["--time=1:xx", "--"], "--time ('1:xx') must be a Slurm time"),
        (["--time=2", "--warning_sec=120", "--"], "--warning_sec (120) must be shorter than --time (2)"),
        (["--nodes=0", "--"], "--nodes (0) must be >= 1"),
        (["--nodes=2-x", "--"], "--nodes ('2-x') must be a number of nodes, M, or a range, MIN-MAX"),
        (
            ["--nodes=3", "--", "--device=cpu", "--num_gpus=2", "--micro_batches=8"],
            "(--num_gpus=2 x 3 tasks) so every tower gets the same number of micro-batches; with --num_gpus=2, "
            "these numbers of tasks do: 1, 2, 4",
        ),
        (
            ["--nodes=2-4", "--", "--device=cpu", "--num_gpus=2", "--micro_batches=8"],
            "on 3 of --nodes=2-4 nodes: trainer flags: --micro_batches (8) must be a multiple of the towers",
        ),
        (
            ["--tasks_per_node=2", "--", "--device=cpu", "--num_gpus=2", "--micro_batches=2"],
            "--micro_batches (2) must be a multiple of the towers (--num_gpus=2 x 2 tasks)",
        ),
        (["--tasks_per_node=2", "--gpus_per_node=3", "--"], "--gpus_per_node (3) must be a multiple of --tasks_per"),
        (
            ["--tasks_per_node=2", "--gpus_per_node=8", "--", "--num_gpus=8"],
            "--gpus_per_node (8) differs from the trainer's --num_gpus (8) x --tasks_per_node (2)",
        ),
        (["--tasks_per_node=9", "--", "--device=cpu", "--global_batch_size=144"], "pass the trainer --cluster_port"),
        (["--", "--model_dir=/elsewhere"], "give --model_dir to launch.slurm"),
    ],
)
def test_bad_options_fail_before_submitting(capsys, tmp_path, argv, message):
    split = argv.index("--")
    code, _, err = _render(capsys, f"--model_dir={tmp_path}/x", *argv[:split], "--", *argv[split + 1 :])
    assert code == 2 and message in err


def test_a_failed_sbatch_keeps_the_script_and_exits_1(capsys, tmp_path, monkeypatch):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: Invalid partition name specified' >&2\nexit 1\n")
    (fake / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    code = launcher.main([f"--model_dir={tmp_path}/run", "--partition=nope", "--", "--device=cpu"])
    err = capsys.readouterr().err
    assert code == 1 and "Invalid partition name specified" in err
    scripts = os.listdir(tmp_path / "run" / "slurm")
    assert len(scripts) == 1 and scripts[0].startswith("towerflow-run-") and scripts[0].endswith(".sbatch")


def test_submission_prints_the_log_and_the_job_id_last(capsys, tmp_path, monkeypatch):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/sbatch-args\necho "4242;cluster"\n')
    (fake / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    assert launcher.main([f"--model_dir={tmp_path}/run", "--", "--device=cpu"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == "submitted job 4242"
    assert f"log:     {tmp_path}/run/slurm/towerflow-run-4242.log  (appended across requeues)" in out
    args = (tmp_path / "sbatch-args").read_text().split()
    assert args[0] == "--parsable" and args[1].startswith(f"{tmp_path}/run/slurm/towerflow-run-")
