"""`python -m benchmarks --input`: the input pipeline alone, in images/s, on ImageNet-sized synthetic JPEGs.

Writes 500x375 JPEGs with `python -m data.prepare synthetic --format=jpeg` into a temporary directory, then
times each pipeline of `benchmarks.input.pipelines` on one core (tf.data's private thread pool of 1 thread,
no intra-op parallelism) and on all cores, as the median images/s of several timed windows after a warm-up.
Ratios are to (a), `tf.io.decode_jpeg` alone on the same bytes: the practical ceiling of a JPEG pipeline.
From (c) per core it derives how many cores a GPU training ResNet-50 needs to be fed. The figures
`input_none_vs_decode` and `input_imagenet_vs_decode` ((b) and (c) over (a), targets 0.9 and 1.0) are then
measured in alternating windows (`benchmarks.input.figures`) and written to the JSON's `figures` list.

Then the same for `pipelines.SMALL_PIPELINES` on the 32x32x3 records of the resnet20-synth setting, and
what each --augment kind costs per image, in microseconds of a core: its pipeline's one-core cost per image
minus that of the same pipeline with --augment=none.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time

from benchmarks.harness import report
from benchmarks.input.jpegs import SHAPE, SIZES, SMALL_SETTING, SMALL_SIZES, InputSize, write_jpegs

# Approximate published ResNet-50 training throughput per GPU (tf_cnn_benchmarks / NVIDIA DeepLearningExamples
# era, batch 256, real data); NOT measured here.
GPU_IMAGES_PER_SEC = {"V100 (fp16)": 1300, "A100 (mixed precision)": 2500}

# --augment kind -> (its pipeline, the same pipeline with --augment=none, what the pipeline is)
AUGMENT_PAIRS = (
    ("imagenet", "towerflow_imagenet", "towerflow_none", "500x375 JPEG files -> 224x224 (none: resize whole)"),
    ("flip", "small_cached_flip", "small_cached_none", "32x32 PNG records, decoded in memory"),
    ("crop_flip", "small_cached_crop_flip", "small_cached_none", "32x32 PNG records, decoded in memory"),
    ("crop_flip", "small_files_crop_flip", "small_files_none", "32x32 PNG records, read and decoded"),
)


def time_pipeline(dataset, size: InputSize) -> dict:
    """Images/s and images per CPU-second (this process's CPU time) of each timed window, and the medians."""
    iterator = iter(dataset)
    for _ in range(size.warmup_batches):
        next(iterator)
    rates, per_cpu_sec, cores_used = [], [], []
    for _ in range(size.windows):
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(size.batches_per_window):
            next(iterator)
        wall, cpu = time.perf_counter() - wall, max(time.process_time() - cpu, 1e-9)
        images = size.batch_size * size.batches_per_window
        rates.append(images / wall)
        per_cpu_sec.append(images / cpu)
        cores_used.append(cpu / wall)
    return {
        "images_per_sec": rates,
        "median_images_per_sec": statistics.median(rates),
        "median_images_per_cpu_sec": statistics.median(per_cpu_sec),
        # Other work on a shared machine takes cores: "all cores" then gets fewer; this says how many it got.
        "median_cores_used": statistics.median(cores_used),
    }


def _time_rows(pipelines: dict, build, size: InputSize) -> list[dict]:
    """Times `build(name, one_core)` for every pipeline on one core, then on all cores: one dict each."""
    rows = []
    for name, (label, what) in pipelines.items():
        row = {"name": name, "label": label, "what": what}
        for cores, one_core in (("one_core", True), ("all_cores", False)):
            row[cores] = time_pipeline(build(name, one_core), size)
            print(f"  {label}: {cores} {row[cores]['median_images_per_sec']:,.0f} images/s", flush=True)
        rows.append(row)
    return rows


def measure(size: InputSize, pattern: str, encoded) -> list[dict]:
    """Every JPEG pipeline (`input_pipelines.PIPELINES`) over the records of `pattern`, whose image bytes are
    `encoded`: one dict per pipeline."""
    from benchmarks.input import pipelines

    rows = _time_rows(
        pipelines.PIPELINES,
        lambda name, one_core: pipelines.build(name, pattern, encoded, size.batch_size, one_core),
        size,
    )
    encoded_bytes = [len(b) for b in encoded.numpy()]
    rows[0]["mean_jpeg_bytes"] = statistics.mean(encoded_bytes)
    return rows


def measure_small(size: InputSize) -> list[dict]:
    """Every 32x32 pipeline (`pipelines.SMALL_PIPELINES`) on the resnet20-synth setting's records."""
    from benchmarks.harness import records
    from benchmarks.harness.plan import SETTINGS
    from benchmarks.input import pipelines

    pattern = records.ensure_records(SETTINGS[SMALL_SETTING])["train"]
    return _time_rows(
        pipelines.SMALL_PIPELINES,
        lambda name, one_core: pipelines.small(name, pattern, size.batch_size, one_core),
        size,
    )


def augmentation_costs(rows: list[dict]) -> list[dict]:
    """Per --augment kind and pipeline: microseconds of a core per image with and without it, their
    difference (what the augmentation costs) and its share of the augmented pipeline's cost."""
    by_name = {row["name"]: row for row in rows}
    costs = []
    for augment, name, none_name, pipeline in AUGMENT_PAIRS:
        with_us, none_us = 1e6 / per_core(by_name[name]), 1e6 / per_core(by_name[none_name])
        costs.append({
            "augment": augment, "pipeline": pipeline, "us_per_image": with_us, "us_per_image_none": none_us,
            "cost_us_per_image": with_us - none_us, "share_of_pipeline": (with_us - none_us) / with_us,
        })  # fmt: skip
    return costs


def per_core(row: dict) -> float:
    """Images per CPU-second of the one-core run: its images/s when it has a core to itself, and unlike
    images/s not lowered when other work on a shared machine takes part of that core."""
    return row["one_core"]["median_images_per_cpu_sec"]


def gpu_needs(rows: list[dict]) -> list[dict]:
    """Cores per GPU = GPU images/s / images per core-second of (c), towerflow's imagenet pipeline."""
    imagenet = per_core(next(r for r in rows if r["name"] == "towerflow_imagenet"))
    return [
        {"gpu": gpu, "published_images_per_sec": rate, "cores_per_gpu": rate / imagenet}
        for gpu, rate in GPU_IMAGES_PER_SEC.items()
    ]


def table(rows: list[dict], needs: list[dict]) -> list[str]:
    """The printed report: one line per pipeline, ratios to (a), then cores per GPU."""
    ceiling_one, ceiling_all = per_core(rows[0]), rows[0]["all_cores"]["median_images_per_sec"]
    header = f"{'pipeline':<28} {'img/core-s':>10} {'vs (a)':>7} {'all cores img/s':>15} {'vs (a)':>7} {'cores':>5}"
    lines = [header + "  what"]
    for row in rows:
        one, every = per_core(row), row["all_cores"]["median_images_per_sec"]
        lines.append(
            f"{row['label']:<28} {one:>10,.0f} {one / ceiling_one:>7.3f} {every:>15,.0f} "
            f"{every / ceiling_all:>7.3f} {row['all_cores']['median_cores_used']:>5.1f}  {row['what']}"
        )
    lines.append("img/core-s: images per CPU-second, pipeline limited to 1 thread (tf.data private_threadpool_size=1)")
    lines.append(f"cores: CPU-seconds per second in the all-cores windows, of {os.cpu_count()} (others take some)")
    lines.append(f"mean JPEG size {rows[0]['mean_jpeg_bytes'] / 1e3:,.0f} KB ({SHAPE[1]}x{SHAPE[0]}, quality 95)")
    for need in needs:
        lines.append(
            f"{need['gpu']}: ~{need['published_images_per_sec']:,} img/s ResNet-50 (approximate published figure, "
            f"not measured) needs {need['cores_per_gpu']:.1f} cores of (c)"
        )
    return lines


def cost_table(small_rows: list[dict], costs: list[dict]) -> list[str]:
    """The printed report of the 32x32 pipelines and of each augmentation's cost per image."""
    lines = [f"{'pipeline':<28} {'us/image':>8} {'img/core-s':>10} {'all cores img/s':>15}  what"]
    for row in small_rows:
        one = per_core(row)
        lines.append(
            f"{row['label']:<28} {1e6 / one:>8.1f} {one:>10,.0f} "
            f"{row['all_cores']['median_images_per_sec']:>15,.0f}  {row['what']}"
        )
    lines.append("us/image: microseconds of a core per image, 1e6 / img/core-s")
    for cost in costs:
        lines.append(
            f"--augment={cost['augment']} on {cost['pipeline']}: {cost['cost_us_per_image']:+.1f} us per image "
            f"({cost['us_per_image']:.1f} vs {cost['us_per_image_none']:.1f}; "
            f"{100 * cost['share_of_pipeline']:.0f}% of the pipeline)"
        )
    return lines


def figure_table(figures: list[dict]) -> list[str]:
    """The figures (`benchmarks.input.figures`) as `python -m benchmarks` prints its own, with their legend."""
    return [report.header(), *map(report.row, figures), *report.legend(figures)]


def main(smoke: bool = False, out: str | None = None) -> int:
    """Runs the benchmark, prints the table, writes JSON to `out` when given. Returns the exit code."""
    size = SIZES["smoke" if smoke else "full"]
    started, load_start = report.now(), list(os.getloadavg())
    print(f"input benchmark, size {size.name}: {size.num_records} JPEGs {SHAPE}, batch {size.batch_size}", flush=True)
    with tempfile.TemporaryDirectory(prefix="towerflow-input-bench-") as work_dir:
        from benchmarks.input import figures as input_figures
        from benchmarks.input import pipelines

        pattern = write_jpegs(work_dir, size.num_records)
        encoded = pipelines.load_encoded(pattern)
        rows = measure(size, pattern, encoded)
        needs = gpu_needs(rows)
        print("\n".join(table(rows, needs)))
        figures = input_figures.measure(size, pattern, encoded)
    print("\n".join(figure_table(figures)))
    small_size = SMALL_SIZES[size.name]
    print(f"32x32 records of {SMALL_SETTING}: batch {small_size.batch_size}", flush=True)
    small_rows = measure_small(small_size)
    costs = augmentation_costs(rows + small_rows)
    print("\n".join(cost_table(small_rows, costs)))
    if out:
        import tensorflow as tf

        env = report.environment({"tensorflow": tf.__version__}, started, load_start)
        run = {"size": dataclasses.asdict(size), "environment": env, "figures": figures, "pipelines": rows}
        run["gpu_needs"] = needs
        run.update(small_size=dataclasses.asdict(small_size), small_pipelines=small_rows, augmentation_costs=costs)
        report.write_json(out, run)
        print(f"wrote {out}")
    return 0
