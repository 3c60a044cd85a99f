"""A command spawned for an Environment's ``exec``: its group, its two output pipes, its exit.

What ``trio.lowlevel.open_process`` does for an exec, for less CPU per
spawn (bench scenario ``agent``, a tool call per model call): ``Popen``
still runs in a worker thread, since it blocks until the child has called
``exec`` and, on a busy host, a child can wait milliseconds for a core, and the exit is
awaited on a pidfd (Linux 5.3+; elsewhere in a worker thread) rather than
through ``trio.Process``.

Don't confuse this with a general subprocess API: stdin is ``/dev/null``,
stdout and stderr are pipes the caller reads, and the child leads a new
session and process group (``start_new_session``), so that the caller can
kill everything the command started with one ``killpg``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence

import trio

__all__ = ["Child", "spawn"]

_pidfd_open = getattr(os, "pidfd_open", None)


class Child:
    """A command started by :func:`spawn`.

    ``stdout`` and ``stderr`` read its pipes; :meth:`aclose` closes them and
    the pidfd. The pid is also the process-group id while the leader is not
    reaped (until :meth:`wait` returns). ``use_pidfd=False`` waits in a
    worker thread, as on systems without pidfds.
    """

    def __init__(self, popen: subprocess.Popen[bytes], stdout: int, stderr: int, *, use_pidfd: bool = True):
        self._popen = popen
        self.pid = popen.pid
        self.stdout = trio.lowlevel.FdStream(stdout)
        self.stderr = trio.lowlevel.FdStream(stderr)
        self._pidfd: int | None = None
        if use_pidfd and _pidfd_open is not None:
            with contextlib.suppress(OSError):  # no pidfds in this kernel: wait in a thread
                self._pidfd = _pidfd_open(popen.pid)

    @property
    def returncode(self) -> int | None:
        """The exit status once reaped (``-signum`` if killed by a signal), else ``None``."""
        return self._popen.returncode

    async def wait(self) -> int:
        """Wait for the command to exit and reap it; return its exit status."""
        if self._popen.returncode is not None:
            await trio.lowlevel.checkpoint()
        elif self._pidfd is not None:
            await trio.lowlevel.wait_readable(self._pidfd)
            self._popen.wait()  # the pidfd is readable once the child has exited: this does not block
        else:
            await trio.to_thread.run_sync(self._popen.wait, abandon_on_cancel=True)
        code = self._popen.returncode
        assert code is not None
        return code

    def kill_group(self) -> None:
        """SIGKILL the command's process group, only while its leader is not reaped
        (after that the pgid may be free, or reused by an unrelated process)."""
        if self._popen.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)

    async def aclose(self) -> None:
        """Close the pidfd and both pipes (idempotent)."""
        if self._pidfd is not None:
            fd, self._pidfd = self._pidfd, None
            trio.lowlevel.notify_closing(fd)
            os.close(fd)
        await self.stdout.aclose()
        await self.stderr.aclose()


async def spawn(argv: Sequence[str], cwd: str, env: Mapping[str, str] | Mapping[bytes, bytes]) -> Child:
    """Start ``argv`` in ``cwd`` with exactly ``env`` (``str`` or, encoded, ``bytes``), leading a new session.

    Failing to start raises the ``OSError`` and leaves nothing open. Once
    the spawn has begun it is not abandoned: a cancellation arriving
    meanwhile takes effect at the caller's next checkpoint, when the caller
    holds the :class:`Child` and can kill it.
    """
    popen, stdout, stderr = await trio.to_thread.run_sync(_spawn, argv, cwd, env)
    return Child(popen, stdout, stderr)


def _spawn(
    argv: Sequence[str], cwd: str, env: Mapping[str, str] | Mapping[bytes, bytes]
) -> tuple[subprocess.Popen[bytes], int, int]:
    """Blocking (until the child has called ``exec``): the process and the read ends of its pipes."""
    out_read, out_write = os.pipe()
    try:
        err_read, err_write = os.pipe()
    except BaseException:
        os.close(out_read)
        os.close(out_write)
        raise
    try:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out_write,
            stderr=err_write,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
    except BaseException:
        os.close(out_read)
        os.close(err_read)
        raise
    finally:
        os.close(out_write)
        os.close(err_write)
    return popen, out_read, err_read
