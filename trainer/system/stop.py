"""Stop requests by signal, and the exit codes a run ends with. Imports no TensorFlow.

SIGTERM (Slurm preemption, `scontrol requeue`, `scancel`), SIGINT (Ctrl-C), SIGHUP (the terminal closed, the
ssh connection dropped), SIGUSR1 and SIGUSR2 (the usual time-limit warnings, `sbatch --signal=B:USR1@T`) all
ask the run to stop: the handler only records the
signal, and the loop honours it after the current step (sync) or update (async) by checkpointing and exiting
with `EXIT_RESUMABLE`. Recording only, never raising, means a second signal during a save cannot cut the
save short. `trainer/__main__.py` installs the handlers before TensorFlow is imported, so a signal during the
first seconds of a run still ends it cleanly.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import threading
import time

EXIT_OK = 0  # trained to --train_steps, evaluated, exported
EXIT_FAILED = 1  # an unexpected error (a traceback says where)
EXIT_USAGE = 2  # bad flags or data: the message says what to change; rerunning as is fails again
EXIT_DIVERGED = 3  # a loss, gradient or weight stopped being finite; the last checkpoint is finite
EXIT_RESUMABLE = 75  # stopped by a signal with the state checkpointed, or a full disk: rerun the same command
# (75 is sysexits' EX_TEMPFAIL; below 128, unlike the 128+signal codes, which sacct showed as `2:0`)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
# The signals schedulers are asked to send before a time limit; they make a Slurm job requeue itself.
TIME_LIMIT_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)


class StopRequested(Exception):
    """The run stopped because of `signum`: at step `step` (None: before the model was built), with the
    signal arriving while the training loop ran or before it started."""

    def __init__(self, message: str, signum: int, step: int | None, signalled_while_training: bool):
        super().__init__(message)
        self.signum = signum
        self.step = step
        self.signalled_while_training = signalled_while_training


class Diverged(RuntimeError):
    """The loss or the gradient stopped being finite (or a weight, seen before a save). The update that
    carried it was not applied, and no non-finite weight was checkpointed or exported."""


class NoSpace(RuntimeError):
    """The disk filled up (a checkpoint, TensorBoard events, the export); the previous checkpoint is whole.
    Free space and rerun: exit `EXIT_RESUMABLE`."""


def is_no_space(error: BaseException) -> bool:
    """Whether `error` is a full disk: an OSError's ENOSPC, or TensorFlow's error carrying it as text (a
    summary flush fails with a ResourceExhaustedError, the same class as running out of memory)."""
    return getattr(error, "errno", None) == errno.ENOSPC or "No space left on device" in str(error)


@contextlib.contextmanager
def out_of_space(doing: str, kept):
    """A full disk met while `doing` (writing events, exporting) becomes `NoSpace`, one line and exit 75:
    nothing is lost that `kept()` (what is safe, e.g. the last whole checkpoint) does not name."""
    try:
        yield
    except NoSpace:
        raise
    except Exception as e:
        if not is_no_space(e):
            raise
        message = f"no space left on device {doing}; {kept()}. Free space and rerun the same command to resume."
        raise NoSpace(message) from e


class StopRequest:
    """Which stop signals arrived, and when the first did. Process-wide: see `REQUEST`."""

    def __init__(self):
        self.signals: list[int] = []
        self.first_at: float | None = None  # time.monotonic() of the first signal
        self._previous: dict[int, object] = {}
        self._wakeup_write: int | None = None  # the pipe `notifying` watches, while it does

    @property
    def requested(self) -> bool:
        return bool(self.signals)

    @property
    def signum(self) -> int | None:
        """The first stop signal: it decides what the stop means (time limit or preemption)."""
        return self.signals[0] if self.signals else None

    def handle(self, signum: int, frame=None) -> None:
        """The signal handler: records, nothing else (it may run in the middle of a save)."""
        if self.first_at is None:
            self.first_at = time.monotonic()
        if signum == signal.SIGHUP:
            _leave_terminal()
        self.signals.append(signum)
        if self._wakeup_write is not None:  # a call from Python (tests) rather than a real signal: tell too
            with contextlib.suppress(OSError):
                os.write(self._wakeup_write, bytes([signum]))

    def install(self) -> bool:
        """Installs `handle` for every stop signal not yet handled by it; returns whether it installed any.
        Only the main thread may install handlers: elsewhere nothing happens (and False is returned)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        installed = False
        for sig in STOP_SIGNALS:
            if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
                continue  # `nohup`: the user asked the run to outlive its terminal
            if signal.getsignal(sig) != self.handle:
                self._previous[sig] = signal.signal(sig, self.handle)
                installed = True
        return installed

    def uninstall(self) -> None:
        """Puts back the handlers `install` replaced."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def ignore_from_now(self) -> None:
        """Ignores stop signals for the rest of the process: the run is over and its exit code decided. At
        exit CPython resets Python-handled signals to their default action, which for SIGUSR1 is to die, so
        a time-limit warning during TensorFlow's slow teardown would turn a finished job into FAILED (0:10).
        SIG_IGN is left in place."""
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)

    def clear(self) -> None:
        self.signals, self.first_at = [], None

    @contextlib.contextmanager
    def handling(self):
        """Handles stop signals inside the block. If it installed the handlers, it restores the previous
        ones after the block and forgets the signals it saw, so a library caller's next run starts afresh;
        a caller that installed them earlier (`python -m trainer`, from its first line) keeps both."""
        installed = self.install()
        try:
            yield self
        finally:
            if installed:
                self.uninstall()
                self.clear()

    @contextlib.contextmanager
    def notifying(self, callback):
        """Calls `callback()` from a helper thread as soon as a stop signal arrives, also while the main
        thread is inside a TensorFlow call.

        Python runs signal handlers in the main thread between bytecodes, so a handler waits until the
        TensorFlow call in progress returns: with several steps per call (`trainer.step.sync`), that could be
        many steps. The C-level handler, though, writes the signal number to the wakeup fd at once; a thread
        reading it calls `callback` (e.g. setting a flag the in-graph loop checks before every step).
        `handle` also writes there, for stops recorded without a signal. Outside the main thread, where no
        wakeup fd can be set, only those are seen.
        """
        read, write = os.pipe()
        os.set_blocking(write, False)  # a wakeup fd must never block the signal handler
        previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        self._wakeup_write = write
        watcher = threading.Thread(target=_watch, args=(read, callback), name="stop-watcher", daemon=True)
        watcher.start()
        try:
            yield self
        finally:
            if previous is not None:
                signal.set_wakeup_fd(previous)
            self._wakeup_write = None
            os.write(write, b"\0")  # not a signal number: the watcher returns
            watcher.join()
            os.close(read)
            os.close(write)

    def describe(self) -> str:
        return signal.Signals(self.signum).name if self.signum else "no signal"


def _leave_terminal() -> None:
    """After a hangup the terminal is gone and writing to it fails (EIO), which would turn the clean stop into a
    traceback: the standard streams that were the terminal now go to /dev/null (a log file stays as it is)."""
    null = None
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            if os.isatty(fd):
                null = os.open(os.devnull, os.O_WRONLY) if null is None else null
                os.dup2(null, fd)
    if null is not None:
        os.close(null)


def _watch(read: int, callback) -> None:
    """Reads signal numbers from `read` until a 0; calls `callback` for each stop signal."""
    while True:
        for signum in os.read(read, 64):
            if signum == 0:
                return
            if signum in STOP_SIGNALS:
                callback()


REQUEST = StopRequest()
