"""Whether a step fits in memory: estimated from the model before anything is built (`estimate`), and
counted from the placed variables and the traced step against `--device_memory_mb` (`device_memory`)."""
