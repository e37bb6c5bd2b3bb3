"""The model cut into pipeline stages once per model: the step's runner (`trainer.step.sync.runners.make_runner`)
and eval's forward (`trainer.step.sync.runners.inference`) take the same cut, made by the first of them to ask.

`models.stages.cut` walks the model and balances the stages by bytes (or follows `--pipeline_cuts`); the
cut of a model does not change while it lives, so it is kept beside the model (weakly: it goes with the model).
"""

from __future__ import annotations

import weakref

from models import stages
from trainer.settings.config import Pipeline

_CUTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {Pipeline: its stages}


def cut_of(model, pipeline: Pipeline) -> list[stages.Stage]:
    """`model` cut into `pipeline.stages` stages (`models.stages.cut`, after `pipeline.cuts`), made once.

    Raises:
      ModelError: as `models.stages.cut`.
    """
    made = _CUTS.setdefault(model, {})
    if pipeline not in made:
        made[pipeline] = stages.cut(model, pipeline.stages, pipeline.cuts)
    return made[pipeline]
