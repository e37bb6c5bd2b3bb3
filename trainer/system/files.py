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


# Characters TensorFlow's file patterns (`GetMatchingPaths`: tf.io.gfile.glob, the checkpoint reader's and
# CheckpointManager's file checks) read as wildcards or escapes, even in a path meant literally.
_PATTERN_CHARACTERS = frozenset("*?[\\")
_HELD: dict[str, int] = {}  # directory -> descriptor held open for `literal_dir`'s alias


def literal_dir(directory: str) -> str:
    """A name for `directory` that TensorFlow cannot read as a pattern: `directory` itself unless its path
    holds `*`, `?`, `[` or `\\`, else `/proc/self/fd/<fd>` of a descriptor this process holds open on it
    (Linux). TensorFlow checks a checkpoint exists by globbing its prefix, so under `exp[1]/` it finds none,
    restores none and deletes none; through the alias it finds them. Creates `directory` if need be.

    Only the process's own calls into TensorFlow may use the alias: a path shown to people or written to a
    file must be the real one."""
    if not _PATTERN_CHARACTERS.intersection(directory) or not os.path.isdir("/proc/self/fd"):
        return directory
    os.makedirs(directory, exist_ok=True)
    fd = _HELD.get(directory)
    if fd is None or not os.path.samestat(os.fstat(fd), os.stat(directory)):  # removed and made again since
        if fd is not None:
            os.close(fd)
        fd = _HELD[directory] = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    return f"/proc/self/fd/{fd}"
