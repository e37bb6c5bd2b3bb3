"""benchmarks/probes/tensor_first_step.py without running a trainer: the times it reads from a run's console, the
command lines it compares (the same devices and micro-batches, split or not), and its tables."""

import json

import pytest

from benchmarks.probes import tensor_first_step as probe

CONSOLE = [
    (1.0, "task       lm"),
    (61.5, "attempt 1 (host vm, pid 1): fresh start at step 0"),
    (200.0, "step       1/3  loss 5.2877  lr 0.05  first step 138.2 s (includes graph tracing)"),
    (203.5, "step       2/3  loss 4.2465  lr 0.025  77 ex/s  eta 0:00:00"),
    (206.0, "step       3/3  loss 4.0001  lr 0.0  77 ex/s  eta 0:00:00"),
]


@pytest.mark.quick
def test_parse_reads_the_build_the_printed_first_step_and_the_shortest_later_gap():
    assert probe.parse(CONSOLE) == {"build": 61.5, "first": 138.2, "later": 2.5}
    assert probe.parse(CONSOLE[:4])["later"] is None  # one later step: no gap between two later ones


@pytest.mark.quick
def test_split_and_unsplit_commands_keep_the_devices_and_micro_batches():
    unsplit = probe.command("lm", 0, "/m", None, 3)
    split = probe.command("hub", 2, "/m", ("/t.tfrecord", "/e.tfrecord"), 3)
    for argv in (unsplit, split):
        assert {"--num_gpus=4", "--micro_batches=4", "--train_steps=3", "--log_every_steps=1"} <= set(argv)
    assert "--tensor_shards=1" in unsplit and not any(a.startswith("--tensor_parallel") for a in unsplit)
    assert {"--tensor_parallel=2", "--tensor_shards=4", "--train_data=/t.tfrecord"} <= set(split)
    assert "--task=benchmarks.harness.hub_tasks:TiedGPT2" in split
    assert probe.layouts([1, 2, 4]) == [0, 1, 2, 4]


@pytest.mark.quick
def test_table_gives_medians_and_the_first_step_over_the_unsplit_ones(tmp_path, capsys):
    load = {"load_average_start": 4.0, "load_average_end": 5.0}
    rows = [
        {"model": "lm", "parallel": 0, "build": 60.0, "first": 100.0, "later": 3.0, **load},
        {"model": "lm", "parallel": 0, "build": 70.0, "first": 120.0, "later": None, **load},
        {"model": "lm", "parallel": 4, "build": 80.0, "first": 165.0, "later": 2.0, **load},
    ]
    lines = probe.table(rows).splitlines()
    assert lines[2] == "| lm | unsplit (N=1) | 65.0 | 110.0 | 3.00 | 1.00 | 4.0/5.0 4.0/5.0 |"
    assert lines[3] == "| lm | T=4, N=4 | 80.0 | 165.0 | 2.00 | 1.50 | 4.0/5.0 |"
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    assert probe.main([f"--rows={tmp_path / 'rows.json'}"]) == 0
    assert capsys.readouterr().out.splitlines()[3] == lines[3]


@pytest.mark.quick
def test_bytes_table_sets_the_counted_activations_beside_megatrons_in_units_of_a():
    size = probe.hub_size(8)
    a = size.activation
    row = {"parallel": 2, "activation": a, "total": 17 * a + 168, "activations": 17 * a, "kinds": {"scalars": 168}}
    row.update(megatron_split_layers=16 * a, megatron_all=probe.megatron_bytes(size, 2))
    assert a == 8 * 8 * 32 * 4  # b x s x h x 4 bytes of benchmarks/harness/hub_tasks.py's windows
    line = probe.bytes_table([row]).splitlines()[2]
    assert line == "| 2 | 4 | 139,432 | 139,264 | 17 | 16 | 20 | scalars 168 |"


@pytest.mark.quick
def test_cpu_table_sets_each_runs_first_step_cpu_beside_its_repeats_unsplit_run():
    rows = [
        {"model": "hub", "parallel": 0, "repeat": 0, "build_cpu": 6.0, "first_cpu": 10.0},
        {"model": "hub", "parallel": 2, "repeat": 0, "build_cpu": 7.0, "first_cpu": 31.0},
        {"model": "hub", "parallel": 2, "repeat": 1, "build_cpu": 7.0, "first_cpu": 30.0},
        {"model": "hub", "parallel": 0, "repeat": 1, "build_cpu": 6.0, "first_cpu": 12.0},
    ]
    lines = probe.cpu_table(rows).splitlines()
    assert lines[3] == "| hub | T=2, N=4 | 0 | 7.0 | 31.0 | 3.10 |"
    assert lines[4] == "| hub | T=2, N=4 | 1 | 7.0 | 30.0 | 2.50 |"
