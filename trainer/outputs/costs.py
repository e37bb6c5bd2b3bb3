"""Settings known to cost speed on the devices at hand: said once at start-up and kept in metrics.json.

One table, `KNOWN_COSTS`, of what was measured and where. A run whose settings match a row (the setting's
value and the towers' device kind, `--device`) gets one warning line per row; a run on GPUs gets none, since
nothing here was measured on one.
"""

from __future__ import annotations

import dataclasses

from trainer.settings import table
from trainer.settings.config import RunConfig

RESULTS = "benchmarks/results/headline.md"


@dataclasses.dataclass(frozen=True)
class KnownCost:
    """A setting that is slower than its default on one kind of tower device, as measured."""

    setting: str  # a RunConfig field ("towers.mixed_precision"); its flag comes from the flag table
    value: object  # the value that costs
    device: str  # the towers' device kind (--device) it was measured on
    speed: str  # examples/s against the default, per benchmark setting
    measured: str  # the figure in RESULTS.md, and the run it comes from
    instead: str  # what to do instead

    def applies(self, config: RunConfig) -> bool:
        return config.towers.device == self.device and table.setting(config, self.setting) == self.value

    def warning(self) -> str:
        flag = f"--{table.flag_name(self.setting)}"
        flag += "" if self.value is True else f"={self.value}"
        return (
            f"{flag} on {self.device.upper()} towers runs at {self.speed} of the default's examples/s "
            f"({RESULTS} {self.measured}); {self.instead}"
        )


_FULL_RUN = "2 cores, TF 2.21, commit cdf358c"
KNOWN_COSTS = (
    KnownCost(
        "towers.mixed_precision",
        "fp16",
        "cpu",
        speed="0.255 (cnn-digits)",
        measured=f"fp16_vs_fp32, {_FULL_RUN}: float16 is emulated on CPUs",
        instead="--mixed_precision=bf16 runs at 1.03-1.19 there (bf16_vs_fp32)",
    ),
    KnownCost(
        "towers.jit_compile",
        True,
        "cpu",
        speed="0.205 (cnn-digits) and 0.653 (resnet20-synth)",
        measured=f"xla_vs_default, {_FULL_RUN}",
        instead="leave --xla off on CPUs; it is meant for GPUs",
    ),
)


def cost_warnings(config: RunConfig) -> list[str]:
    """The warning of every known cost the settings of `config` (resolved) incur, in table order."""
    return [cost.warning() for cost in KNOWN_COSTS if cost.applies(config)]
