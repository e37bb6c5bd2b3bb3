"""`python -m benchmarks.probes NAME [ARGS]`: one-off measurements that explain a headline figure.

Each probe answers one question the table raised (where a step's or an update's time goes, how the Keras
reference is tuned, where two profiled sides differ); none is part of the headline table. Results: in the
sections of benchmarks/results/ they explain (headline.md, async.md, keras.md).
"""

import sys

from benchmarks.harness import commands

COMMANDS = {
    "step_overhead": "benchmarks.probes.step_overhead",
    "async_overhead": "benchmarks.probes.async_overhead",
    "keras_spe": "benchmarks.probes.keras_spe",
    "profile_summary": "benchmarks.probes.profile_summary",
    "lm_padding": "benchmarks.probes.lm_padding",
    "lm_generate": "benchmarks.probes.lm_generate",
    "dtensor": "benchmarks.probes.dtensor",
    "pipeline_schedule": "benchmarks.probes.pipeline_schedule",
    "pipeline_memory": "benchmarks.probes.pipeline_memory",
    "lm_memory": "benchmarks.probes.lm_memory",
    "lm_vocab": "benchmarks.probes.lm_vocab",
    "feature_checks": "benchmarks.probes.feature_checks",
    "first_step": "benchmarks.probes.first_step",
    "tensor_parallel": "benchmarks.probes.tensor_parallel",
    "tensor_first_step": "benchmarks.probes.tensor_first_step",
}

if __name__ == "__main__":
    sys.exit(commands.dispatch("python -m benchmarks.probes", COMMANDS, sys.argv[1:]))
