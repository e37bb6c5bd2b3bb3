"""The sync mode: `SyncUpdate` (`sync_update`: the host side of a window of steps), the traced step it calls
(`step_graph`), and how the step runs its micro-batches: whole on towers or through pipeline stages (`runners`)."""
