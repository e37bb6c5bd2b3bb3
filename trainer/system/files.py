"""Writing a file so that a reader never sees it half-written: the one place the trainer does it.

The text goes to a temporary sibling, is flushed to disk, and is renamed over the target (`os.replace` is
atomic on POSIX file systems): a kill or a full disk leaves either the old file or the new one, never a torn
one, and no temporary file behind.
"""

from __future__ import annotations

import contextlib
import os


def write_atomically(path: str, text: str, temp_suffix: str = ".tmp") -> None:
    """Replaces `path` with `text`, whole or not at all.

    Args:
      path: the file to write.
      text: its new content.
      temp_suffix: appended to `path` for the temporary file (e.g. the `.tmp<hex>` TensorFlow's own atomic
        writes use, which its checkpoint clean-up recognises).

    Raises:
      OSError: the write failed (e.g. ENOSPC); `path` is as it was and the temporary file is removed.
    """
    tmp = path + temp_suffix
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
