"""Which ratios a benchmark run publishes (issue #56, benchmarks/harness/trust.py): each window's load read from
/proc (load.py), and a language model's figure refused when its sides' matmul peaks differ beyond their noise or
the load average was above the CPU count. A figure is measured by `runner.measure` through fake workers and a fake
/proc: nothing is timed for real."""

import pytest

from benchmarks import figures
from benchmarks.harness import load, report, runner, trust
from benchmarks.harness.plan import SETTINGS, SIZES

PID = 4242
# the lm-peers figure of towerflow (1 tower) against nanoGPT in PyTorch: both sides in the one-device worker
FIGURE = figures.peer_figures(SETTINGS["lm-peers"])[3]
TORCH_ONE_THREAD = figures.peer_figures(SETTINGS["lm-peers"])[6]


class FakeProc:
    """A /proc of 2 CPUs whose counters each window advances: 300 jiffies pass on the 2 CPUs, 250 of them busy,
    200 of those this run's (PID): the other processes used 50 / 300 * 2 = 1/3 of a CPU."""

    def __init__(self, root, load_average: float):
        self.root, self.busy, self.total, self.own = root, 1000, 4000, 500
        (root / str(PID)).mkdir(parents=True)
        (root / "loadavg").write_text(f"{load_average:.2f} 1.00 1.00 3/400 {PID}\n")
        self.write()

    def write(self):
        user, idle = self.busy - 100, self.total - self.busy - 50  # system 60, irq 0, softirq 20, steal 20, iowait 50
        cpu = f"{user} 0 60 {idle} 50 0 20 20 0 0"
        (self.root / "stat").write_text(f"cpu  {cpu}\ncpu0 {cpu}\ncpu1 {cpu}\nintr 1 2\nctxt 5\n")
        # the command name holds a space and a parenthesis; utime stime cutime cstime are fields 14-17
        own = f"{self.own - 7} 5 2 0"
        (self.root / str(PID) / "stat").write_text(f"{PID} (python (x) S 1 1 1 0 -1 0 0 0 0 0 {own} 20\n")

    def advance(self):
        self.busy, self.total, self.own = self.busy + 250, self.total + 300, self.own + 200
        self.write()


class FakeWorker:
    """One worker holding both sides: towerflow's windows take 1 s, PyTorch's 2 s (the ratio is 2.0); `stats`
    are each side's matmul repeats (FLOP/s) and threads."""

    def __init__(self, proc: FakeProc, peaks: dict):
        self.proc, self.peaks = proc, peaks

    def build(self, side, setting, records, trace_steps):
        return side.kind

    def ready(self):
        return {"runtime": {}}

    def call(self, cmd, side_id, **fields):
        if cmd == "window":
            self.proc.advance()
            return {"seconds": 1.0 if side_id == "towerflow" else 2.0, "examples": 16 * fields["steps"]}
        rates, threads = self.peaks[side_id]
        return {"ok": True, "matmul_rates": rates, "matmul_threads": threads, "matmul_peak_flops": max(rates)}


class FakeSessions:
    def __init__(self, worker):
        self.worker = worker

    def get(self, key):
        return self.worker

    def pids(self):
        return [PID]


def _measure(tmp_path, monkeypatch, torch_peaks, load_average=1.5, figure=FIGURE):
    monkeypatch.setattr(load, "PROC", str(tmp_path))
    peaks = {"towerflow": ([47e9, 48.3e9, 48.3e9, 50e9], 2), "nanogpt_torch": torch_peaks}
    sessions = FakeSessions(FakeWorker(FakeProc(tmp_path, load_average), peaks))
    return runner.measure(figure, SIZES["smoke"], sessions, records={})


@pytest.mark.quick
def test_a_ratio_whose_sides_matched_is_published_with_each_windows_load(tmp_path, monkeypatch):
    record = _measure(tmp_path, monkeypatch, torch_peaks=([46e9, 47.5e9, 48e9, 52e9], 2))
    assert record["status"] == "ok" and record["ratio"] == 2.0 and "refused" not in record
    window = {"load_average_start": 1.5, "load_average_end": 1.5, "cpus_start": 2, "cpus_end": 2, "other_cpus": 0.333}
    assert record["a"]["load"] == record["b"]["load"] == [window] * SIZES["smoke"].windows
    assert record["load"] == {"load_average_start_max": 1.5, "cpus": 2, "other_cpus_median": 0.333}
    assert report.row(record).split()[2] == "2.000" and report.row(record).split()[-1] == "1.5/2"
    assert report.refusals([record]) == []
    assert (
        "load average up to 1.50 at a window's start on 2 CPUs; other processes 0.33 CPUs"
        in report.legend([{**record, "setting_text": "s"}])[0]
    )
    # within the run's own threads' allowance above the CPU count
    assert _measure(tmp_path / "x", monkeypatch, ([48e9] * 4, 2), load_average=2.4)["status"] == "ok"


@pytest.mark.quick
def test_a_starved_side_refuses_the_figure_with_its_reason(tmp_path, monkeypatch):
    record = _measure(tmp_path, monkeypatch, torch_peaks=([11e9, 12e9, 12.2e9, 13e9], 2))
    assert record["status"] == "refused" and record["ratio"] is None and record["passed"] is None
    assert "pair_ratios" not in record and record["a"]["examples_per_sec"] == [32.0] * 3  # the rates stay
    assert report.refusals([record]) == [
        "refused lm_tower1_vs_nanogpt_torch: starved: nanogpt_torch side's matmul peak 12.1 GFLOP/s on 2 thread(s)"
        " vs towerflow's 48.3 on 2 (noise 10%)"
    ]
    cells = report.row(record).split()
    assert cells[2:5] == ["-", "-", "REFUSED"] and cells[-1] == "1.5/2"


@pytest.mark.quick
def test_peaks_are_compared_per_thread_against_the_wider_of_their_spreads(tmp_path, monkeypatch):
    # PyTorch on one thread at half towerflow's 2-thread peak had the same machine
    half = _measure(tmp_path / "1", monkeypatch, ([24e9, 24.2e9, 24.5e9], 1), figure=TORCH_ONE_THREAD)
    assert half["status"] == "ok"
    # 25% apart, but one side's repeats spread over 40% of their median: within the noise
    noisy = _measure(tmp_path / "2", monkeypatch, ([25e9, 30e9, 36e9, 45e9, 50e9], 2))
    assert noisy["status"] == "ok"
    assert trust.PEAK_NOISE_FLOOR == 0.10


@pytest.mark.quick
def test_a_load_above_the_cpu_count_refuses_the_figure(tmp_path, monkeypatch):
    record = _measure(tmp_path, monkeypatch, torch_peaks=([11e9, 12e9, 12.2e9, 13e9], 2), load_average=3.5)
    assert record["refused"] == (
        "loaded: 1-minute load average 3.50 at a window's start, above 2 CPUs + 1 (6 of 6 windows); "
        "starved: nanogpt_torch side's matmul peak 12.1 GFLOP/s on 2 thread(s) vs towerflow's 48.3 on 2 (noise 10%)"
    )
    loaded = _measure(tmp_path / "x", monkeypatch, ([48e9] * 4, 2), load_average=3.5)
    assert loaded["status"] == "refused" and loaded["refused"].startswith("loaded: 1-minute load average 3.50")


@pytest.mark.quick
def test_a_window_of_an_unreadable_process_has_no_other_share(tmp_path, monkeypatch):
    monkeypatch.setattr(load, "PROC", str(tmp_path))
    FakeProc(tmp_path, 0.5)
    start = load.snapshot([PID])
    assert (start.load_average, start.cpus, start.own_jiffies) == (0.5, 2, 500)
    assert load.window_load(start, load.snapshot([PID, 99999]))["other_cpus"] is None
    assert load.window_load(start, start)["other_cpus"] is None  # no time passed
