"""TFRecords of a setting, written once and cached next to the digits cache.

Written by the project's own tools in a subprocess (`data.ensure_digits`, `python -m data.prepare
synthetic`), so the parent process never imports TensorFlow. A synthetic set is written into a temporary
directory and renamed into place, so a crash or a concurrent run never leaves a half-written cache.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

from benchmarks.harness import paths
from benchmarks.harness.plan import Setting
from data import digits

_VERSION = "v1"  # bump when what is written changes
# The default text corpus's settings (Setting.data): its tokens and, for subword tokens, the vocabulary's size.
TEXT_TOKENS = {"pydoc": ("char", None), "pydoc-subword4000": ("subword", 4000)}


def _python(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, *args], cwd=paths.REPO_ROOT, capture_output=True, text=True, check=False, env=_quiet_env()
    )
    if done.returncode:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return done.stdout


def _quiet_env() -> dict:
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}


def ensure_records(setting: Setting) -> dict:
    """Returns {"train": glob, "eval": glob} of the setting's records, writing them on first use."""
    if setting.data == "digits":
        out = _python("-c", "import json, data; print(json.dumps(data.ensure_digits()))")
        train, evaluation = json.loads(out.strip().splitlines()[-1])
        return {"train": train, "eval": evaluation}
    if setting.data in TEXT_TOKENS:  # the language model's default corpus, windows of example_shape[0] tokens
        context = setting.example_shape[0] - 1
        tokens, vocab_size = TEXT_TOKENS[setting.data]
        call = f"text.ensure_default_lm_data({context}, {tokens!r}, vocab_size={vocab_size})"
        code = f"import json; from data import text; print(json.dumps({call}))"
        train, evaluation, _ = json.loads(_python("-c", code).strip().splitlines()[-1])
        return {"train": train, "eval": evaluation}
    return _ensure_synthetic(setting)


def _ensure_synthetic(setting: Setting) -> dict:
    shape = ",".join(str(d) for d in setting.example_shape)
    name = f"bench-synthetic-{shape.replace(',', 'x')}-c{setting.num_classes}-n{setting.num_examples}-{_VERSION}"
    root = os.path.dirname(digits.default_cache_dir())
    final = os.path.join(root, name)
    # data.prepare writes info.json last: its presence marks a complete directory.
    if not os.path.isfile(os.path.join(final, "info.json")):
        os.makedirs(root, exist_ok=True)
        building = tempfile.mkdtemp(prefix=f".{name}.building-", dir=root)
        try:
            _python("-m", "data.prepare", "synthetic", building, f"--shape={shape}",
                    f"--num_classes={setting.num_classes}", f"--num_examples={setting.num_examples}")  # fmt: skip
            try:
                os.replace(building, final)
            except OSError:
                if not os.path.isfile(os.path.join(final, "info.json")):
                    raise
        finally:
            shutil.rmtree(building, ignore_errors=True)
    with open(os.path.join(final, "info.json")) as f:
        files = json.load(f)["files"]
    return {"train": os.path.join(final, files["train"]), "eval": os.path.join(final, files["eval"])}
