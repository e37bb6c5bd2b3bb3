"""`python -m benchmarks.probes first_step [--settings=lm-peers] [--towers=1,2,4] [--repeats=N] [--no-peers]`: the
time to the first step (issue #45 item 6), towerflow's beside its peers' at the same sizes.

Each side is built in a worker process of its own that has traced nothing yet (`benchmarks.harness.session`):
the worker reports the side's build (model, optimizer, input) and its first window of one step, which traces
and optimises its step's graph (or, in PyTorch, runs eagerly); then two more one-step windows give a step that
traced nothing. towerflow at N towers runs N micro-batches (`lm.task_config`'s setting, the harness's memory
batches), Keras Hub's GPT-2 `fit` on N devices (`MirroredStrategy` above 1), nanoGPT in PyTorch on one process.
The peers need `pip install -e .[peers]`; without them, `--no-peers` times towerflow alone.

Prints a Markdown table: build seconds, first step seconds, a later step's seconds and their ratio, per side
and repeat (a fresh worker each), in side order so the repeats alternate.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

from benchmarks.harness import records as records_lib
from benchmarks.harness.plan import SETTINGS, Setting, Side
from benchmarks.harness.session import Session


def sides(towers: list[int], peers: bool) -> list[Side]:
    """towerflow at each tower count, and with `peers` Keras Hub's `fit` at each and nanoGPT once."""
    found = [Side("towerflow", towers=n) for n in towers]
    if peers:
        found += [Side("keras_hub_fit", towers=n, steps_per_execution=1) for n in towers]
        found.append(Side("nanogpt_torch"))
    return found


def time_side(side: Side, setting: Setting, records: dict, log_dir: str) -> dict:
    """{build, first, later} seconds of `side` built in a fresh worker."""
    session = Session(side.session_key, log_dir)
    try:
        key = session.send_build(side, setting, records, trace_steps=1)
        reply = session.receive_build(key)
        later = [session.call("window", side_id=key, steps=1)["seconds"] for _ in range(2)]
    finally:
        session.process.stdin.close()
        session.process.wait()
    return {"build": reply["build_sec"], "first": reply["trace_sec"], "later": min(later)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.probes first_step", description=__doc__.split("\n")[0])
    parser.add_argument("--settings", default="lm-peers", choices=[s for s in SETTINGS if SETTINGS[s].task])
    parser.add_argument("--towers", default="1,2,4")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--no-peers", dest="peers", action="store_false")
    args = parser.parse_args(argv)
    setting = SETTINGS[args.settings]
    records = records_lib.ensure_records(setting)
    chosen = sides([int(n) for n in args.towers.split(",")], args.peers)
    rows = {side.label(): [] for side in chosen}
    with tempfile.TemporaryDirectory(prefix="towerflow-first-step-") as log_dir:
        for _ in range(args.repeats):
            for side in chosen:
                rows[side.label()].append(time_side(side, setting, records, log_dir))
    print(f"setting {setting.name}: {setting.describe()}; medians of {args.repeats} fresh worker(s) per side\n")
    print("| side | build s | first step s | later step s | first / later |")
    print("|---|---|---|---|---|")
    for label, times in rows.items():
        build, first, later = (statistics.median(t[k] for t in times) for k in ("build", "first", "later"))
        print(f"| {label} | {build:.1f} | {first:.1f} | {later:.2f} | {first / later:.0f} |")
    return 0
