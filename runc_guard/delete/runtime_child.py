"""The runtime as a child of the interposed delete: bounded by the deadline, dying with us.

The delete must outlive its runtime (to report and to keep its record), so the
runtime runs as a child rather than by exec: signals runc-guard receives are
forwarded, the deadline stops it (SIGTERM, then SIGKILL), and it dies with us
(PR_SET_PDEATHSIG) as go-runc would have made it die with the shim.
"""

from __future__ import annotations

import errno
import os

from runc_guard.runtime import inherited_environment, restore_inherited_signals

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence


def _spawn(path: str, argv: list[str], env: dict[bytes, bytes]) -> int:
    """fork + execve of the runtime, which dies with us (PR_SET_PDEATHSIG, SIGKILL); returns its pid.

    go-runc starts its runtime with ``Pdeathsig=SIGKILL`` and kills it at the
    caller's deadline. It now kills runc-guard instead, so the real runtime must
    die with us, or a hung runtime would outlive the deadline containerd set.
    By hand rather than ``subprocess`` (~4 ms of import on every delete, and the
    same fork): a failed execve comes back through a close-on-exec pipe and is
    raised here, as Popen raises it. Every fd we inherited reaches the runtime
    (ours are close-on-exec): the console socket, --preserve-fds, the pid file.
    """
    from runc_guard.libc import PR_SET_PDEATHSIG
    from runc_guard.libc import prctl as lookup_prctl

    prctl = lookup_prctl()
    parent = os.getpid()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only async-signal-safe work until execve
        try:
            prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)  # SIGKILL
            if os.getppid() != parent:  # we died before prctl took effect
                os._exit(128 + 9)
            os.execve(path, argv, env)
        except OSError as exc:
            os.write(err_w, str(exc.errno).encode())
        finally:
            os._exit(127)
    os.close(err_w)
    try:
        failed = os.read(err_r, 16)
    finally:
        os.close(err_r)
    if failed:
        os.waitpid(pid, 0)
        code = int(failed)
        raise OSError(code, os.strerror(code), path)
    return pid


def _reap(pid: int) -> int:
    """The child's status as Popen.wait gives it: the exit code, or -N for death by signal N."""
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


#: After SIGTERM at the deadline, how long the runtime gets before SIGKILL.
STOP_GRACE = 0.3
#: After ``at_deadline`` did the runtime's kill for it, how long the runtime gets to finish
#: its own delete (runc 1.1 looks for the init's death every 100 ms) before SIGTERM.
FINISH_GRACE = 0.3


class RuntimeRun:
    """How one run of the runtime ended: its status as a shell reports it, and why."""

    __slots__ = ("signalled", "status", "timed_out", "waited_ms")

    def __init__(self, status: int, timed_out: bool, signalled: int | None, waited_ms: int) -> None:
        self.status = status
        #: runc-guard stopped it at the deadline (SIGTERM, then SIGKILL).
        self.timed_out = timed_out
        #: The first of SIGTERM/SIGINT/SIGHUP runc-guard received and forwarded, if any.
        self.signalled = signalled
        self.waited_ms = waited_ms


def _wait_until(child_pid: int, timeout: float | None) -> bool:
    """Sleep until the child exits or ``timeout`` passes; True if it exited.

    A pidfd becomes readable the moment the process exits, so there is no
    polling delay (Popen.wait(timeout) sleeps in growing steps up to 50 ms).
    poll() is restarted after a forwarded signal's handler runs (PEP 475).
    """
    import select

    if timeout is None:
        return True
    try:
        fd = os.pidfd_open(child_pid)
    except ProcessLookupError:
        return True
    except OSError as exc:  # ENOSYS before Linux 5.3 (or a seccomp filter): poll instead
        from runc_guard.delete.cgroupfs import FALLBACKS

        FALLBACKS.add(f"pidfd_open:{errno.errorcode.get(exc.errno or 0, exc.errno)}")
        return _poll_until(child_pid, timeout)
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(max(0, int(timeout * 1000))))
    finally:
        os.close(fd)


#: How often the fallback without pidfds looks whether the runtime exited.
POLL_INTERVAL = 0.005


def _poll_until(child_pid: int, timeout: float) -> bool:
    """:func:`_wait_until` without a pidfd: waitid(WNOHANG|WNOWAIT) every POLL_INTERVAL.

    WNOWAIT leaves the child unreaped, so ``_reap`` still collects its status
    and its pid stays ours to signal until then.
    """
    import time

    end = time.monotonic() + max(0.0, timeout)
    while os.waitid(os.P_PID, child_pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        left = end - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(POLL_INTERVAL, left))
    return True


def _helped(at_deadline: Callable[[], bool]) -> bool:
    """``at_deadline()``; an error in it is no help, and never keeps the runtime from being stopped."""
    try:
        return at_deadline()
    except Exception:  # noqa: BLE001 - the runtime must still be stopped and reaped below
        return False


def run_runtime_child(
    path: str,
    args: Sequence[str],
    deadline: float | None = None,
    clock: Callable[[], float] | None = None,
    at_deadline: Callable[[], bool] | None = None,
) -> RuntimeRun:
    """Run the runtime as a child with our argv, environment and fds, bounded by ``deadline``.

    SIGTERM, SIGINT and SIGHUP sent to runc-guard are forwarded to the child, so
    a caller that stops us also stops the runtime it asked for. At ``deadline``
    (a ``clock`` time) the child gets SIGTERM, then SIGKILL after STOP_GRACE:
    runc-guard, not its caller, must be the one that stops a hung runtime, so
    that it can still report and keep its record. A child killed by signal N is
    reported as 128+N, like a shell and like go-runc's callers expect.
    ``at_deadline``, called first, may do what the runtime was still to do (the
    delete's kill of a live init); when it returns True the runtime gets
    FINISH_GRACE to end by itself before it is stopped.
    """
    import _signal  # type: ignore[import-not-found]  # not signal: its enums cost ~1 ms
    import time

    now = clock or time.monotonic
    forwarded = (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP)
    child = 0
    pending: list[int] = []
    received: list[int] = []

    def send(signum: int) -> None:
        try:
            os.kill(child, signum)  # not reaped until the end: the pid is still the child's
        except ProcessLookupError:
            pass

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        if child:
            send(signum)
        else:
            pending.append(signum)

    started = now()
    timed_out = False
    previous = {sig: _signal.signal(sig, forward) for sig in forwarded}
    try:
        restore_inherited_signals()
        child = _spawn(path, [path, *args], inherited_environment())
        for signum in pending:
            send(signum)
        if deadline is not None and not _wait_until(child, deadline - now()):
            timed_out = True
            if at_deadline is not None and _helped(at_deadline) and _wait_until(child, FINISH_GRACE):
                timed_out = False
        if timed_out:
            send(_signal.SIGTERM)
            if not _wait_until(child, STOP_GRACE):
                send(_signal.SIGKILL)
        status = _reap(child)
    finally:
        for sig, handler in previous.items():
            _signal.signal(sig, handler)
    waited_ms = int((now() - started) * 1000)
    return RuntimeRun(
        128 - status if status < 0 else status, timed_out, received[0] if received else None, waited_ms
    )
