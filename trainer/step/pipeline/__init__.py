"""Pipeline stages (`--pipeline_stages`): the model cut once (`cut`), the runner that sends a step's micro-batches
through the stages (`runner`), one stage's pass of one micro-batch (`stage_pass`), the schedules (`schedules`) and
the clock and bubble of a timed step (`clock`)."""
