"""`python -m benchmarks`: towerflow's throughput as a ratio to reference training loops, one row per figure.

    python -m benchmarks                      # full run (both settings, ~20 min on 2 cores)
    python -m benchmarks --quick --out benchmarks/results/quick.json
    python -m benchmarks --smoke              # tiny windows: checks that everything runs (< 1 min)
    python -m benchmarks --only tower1_vs_plain,xla_vs_default --profile /tmp/prof
    python -m benchmarks --quick --settings=lm-pydoc --only=lm   # the language model against Keras fit
    python -m benchmarks --quick --settings=lm-peers   # against Keras Hub GPT-2 fit and nanoGPT (pip install .[peers])
    python -m benchmarks --input [--smoke] [--out FILE]   # the input pipeline alone (benchmarks/input/alone.py)

Each ratio is median(towerflow examples/sec) / median(reference examples/sec) over alternating timed
windows (A, B, A, B, ...) after warm-up. Exit code 0 even when a target is missed: the table says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import signal
import sys
import tempfile

from benchmarks import figures as figure_defs
from benchmarks.harness import mfu, report, runner
from benchmarks.harness import records as records_lib
from benchmarks.harness.plan import SETTINGS, SIZES
from benchmarks.harness.session import Sessions


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    size = parser.add_mutually_exclusive_group()
    quick_help = "fewer, shorter windows; cnn-digits only, runtime figures only with --only (< 5 min)"
    size.add_argument("--quick", action="store_true", help=quick_help)
    size.add_argument("--smoke", action="store_true", help="tiny windows, to check that everything runs")
    parser.add_argument("--out", help="write the results as JSON to this file")
    parser.add_argument("--input", action="store_true", help="time the input pipeline alone on synthetic JPEGs")
    names = figure_defs.NAMES + figure_defs.TASK_NAMES + figure_defs.PEER_NAMES + tuple(figure_defs.INPUT_FIGURES)
    figures_help = f"comma-separated figures: {', '.join(names)}"
    parser.add_argument("--only", type=_names, default=[], help=figures_help)
    parser.add_argument("--settings", type=_names, help=f"comma-separated settings: {', '.join(SETTINGS)}")
    parser.add_argument("--windows", type=int, help="timed windows per side (default depends on the size)")
    parser.add_argument("--profile", default="", help="also trace one window of each side into this directory")
    return parser


def _size(args: argparse.Namespace, parser: argparse.ArgumentParser):
    size = SIZES["smoke" if args.smoke else "quick" if args.quick else "full"]
    if args.windows is not None:
        if args.windows < 1:
            parser.error(f"--windows ({args.windows}) must be at least 1")
        size = dataclasses.replace(size, windows=args.windows)
    if args.settings is not None:
        unknown = [name for name in args.settings if name not in SETTINGS]
        if unknown or not args.settings:
            parser.error(f"--settings: unknown {', '.join(unknown) or '(empty)'}; choose from {', '.join(SETTINGS)}")
        size = dataclasses.replace(size, settings=tuple(args.settings))
    return size


def _exit_on_sigterm(signum, frame):
    # SystemExit unwinds through the `finally` that stops the workers; the default action would not.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    parser = _parser()
    args = parser.parse_args(argv)
    if args.input:
        return _input_alone(args, parser)
    size = _size(args, parser)
    all_figures = [f for name in size.settings for f in figure_defs.figures(SETTINGS[name], size)]
    try:
        selected = figure_defs.select(all_figures, args.only, size)
    except ValueError as e:
        parser.error(str(e))
    input_names = figure_defs.select_input(args.only)
    from trainer.settings import config  # no TensorFlow: which update modes this tree has

    available = {"async"} if "async" in config.UPDATE_MODES else set()
    command = "python -m benchmarks " + shlex.join(sys.argv[1:] if argv is None else argv)
    started, load_start = report.now(), list(os.getloadavg())  # other work on the machine skews every figure
    with tempfile.TemporaryDirectory(prefix="towerflow-bench-logs-") as log_dir:
        sessions = Sessions(log_dir)
        graceful = False
        try:
            runner.start_workers(selected, available, sessions)  # they import TensorFlow meanwhile
            records = {s.name: records_lib.ensure_records(s) for s in {f.setting for f in selected}}
            results = _run(selected, size, records, sessions, available, args.profile)
            env = report.environment(sessions.info(), started, load_start)
            graceful = True
        finally:
            sessions.close(graceful)
    results += _run_input(size, input_names)
    env["matmul_peak_flops"] = mfu.annotate(results)  # the language model's sides: tokens/s and MFU
    env["date_end"], env["load_average_end"] = report.now(), list(os.getloadavg())
    env["command"] = command
    run = {"size": dataclasses.asdict(size), "environment": env, "figures": results}
    print("\n".join(report.legend(results) + report.refusals(results)))
    if args.out:
        report.write_json(args.out, run)
        print(f"wrote {args.out}")
    return 1 if any(r["status"] == "error" for r in results) else 0


def _input_alone(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """`--input`: the input pipeline alone (benchmarks/input/alone.py), which takes no training figure's option."""
    if args.quick or args.only or args.settings or args.windows is not None or args.profile:
        parser.error("--input takes only --smoke and --out")
    from benchmarks.input import alone

    return alone.main(smoke=args.smoke, out=args.out)


def _run(selected, size, records, sessions, available, profile_dir) -> list[dict]:
    print(f"size {size.name}: {size.windows} timed windows per side, {size.warmup_windows} warm-up", flush=True)
    print(report.header(), flush=True)
    results = []
    for record in runner.run(selected, size, records, sessions, available, profile_dir=profile_dir):
        print(report.row(record), flush=True)
        results.append(record)
    return results


def _run_input(size, names: list[str]) -> list[dict]:
    """The input figures in `names`, in this process (the training workers are gone): full-size windows
    but for --smoke (~30 s on 2 cores, most of it writing the JPEGs)."""
    if not names:
        return []
    from benchmarks.input import figures as input_figures

    print("input figures (benchmarks/input/figures.py):", flush=True)
    results = [r for r in input_figures.run("smoke" if size.name == "smoke" else "full") if r["name"] in names]
    for record in results:
        print(report.row(record), flush=True)
    return results


if __name__ == "__main__":
    sys.exit(main())
