"""One training step (floor 3 of docs/architecture.md), by concern: `modes` (what differs between sync and
async, and the run's `Plan`) and `stepper` (what every mode's stepper gives the loop) on top of `sync/`,
`asynchronous/`, `pipeline/`, `transfers/`, `update/`, `memory/` and the `core/` they all stand on."""
