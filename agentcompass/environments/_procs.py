"""What a ``local`` sandbox left running: found through ``/proc``, killed until none is left.

Every process a session starts carries ``AGENTCOMPASS_SANDBOX=<sandbox dir>``
and ``AGENTCOMPASS_SANDBOX_NAME=<session name>`` in its environment, and its
children inherit both, including daemons that left the session's process
group. :func:`scan` reads both from every process in one pass over ``/proc``;
:func:`kill_marked` is the one kill loop, used by ``close`` and ``reap`` (the
sandbox's directory), ``sweep`` (a session-name prefix) and an exec whose
leader is already reaped (one pass, signalling only its group). Callers in
one Trio run share scans, so N sessions closing together cost a few scans
instead of N.

Without ``/proc`` (not Linux) nothing is found: only the process groups the
session started are signalled, as they are.

Don't confuse this with isolation: a process can drop the variables and
escape the sweep. It is how ``local`` cleans up after well-meaning agents.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Collection

import attrs
import trio

__all__ = ["HAVE_PROC", "SANDBOX_ENV", "SANDBOX_NAME_ENV", "Marked", "Scanner", "kill_marked", "scan"]

#: Set in every process a session starts (value: the sandbox directory).
SANDBOX_ENV = "AGENTCOMPASS_SANDBOX"
#: Set in every process a session starts (value: the session name; ``sweep`` looks for it).
SANDBOX_NAME_ENV = "AGENTCOMPASS_SANDBOX_NAME"
HAVE_PROC = os.path.isdir("/proc/self")

# A marked process may fork while we kill: rescan until none is left, this many times at most.
_ROUNDS = 50
# Gives the kernel a moment to tear the killed processes down before rescanning.
_PAUSE_SECONDS = 0.01
_TAG = SANDBOX_ENV.encode()  # the common prefix of both variables: most processes fail this test
_SANDBOX_ITEM = f"{SANDBOX_ENV}=".encode()
_NAME_ITEM = f"{SANDBOX_NAME_ENV}=".encode()


@attrs.frozen
class Marked:
    """A live process carrying a sandbox's variables (``None`` where one is missing)."""

    pid: int
    pgid: int
    sandbox: str | None
    name: str | None


def scan() -> list[Marked]:
    """Blocking: one pass over ``/proc``, every live process carrying either variable."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read()
            # A zombie has an empty environ and is already dead: it never matches.
            if _TAG not in environ:
                continue
            sandbox = name = None
            for item in environ.split(b"\0"):
                if sandbox is None and item.startswith(_SANDBOX_ITEM):
                    sandbox = os.fsdecode(item[len(_SANDBOX_ITEM) :])
                elif name is None and item.startswith(_NAME_ITEM):
                    name = os.fsdecode(item[len(_NAME_ITEM) :])
            if sandbox is not None or name is not None:
                found.append(Marked(pid, os.getpgid(pid), sandbox, name))
        except (OSError, ValueError):
            continue  # gone, or not ours to read
    return found


async def kill_marked(chosen: Callable[[Marked], bool], pgids: Collection[int] = (), *, sweep: bool = True) -> None:
    """SIGKILL the processes ``chosen`` picks and the groups of ``pgids`` they are in.

    A group in ``pgids`` is signalled only while a chosen process is in it (a
    pgid whose processes all died may have been reused by an unrelated
    process). With ``sweep`` every chosen process is killed too, scanning
    again until none is left; without, one pass signals the groups only.
    Never signals this process or its group. Without ``/proc`` the groups in
    ``pgids`` are signalled as they are. A cancellation abandons a running
    scan (killing is safe to leave half-done: the next close or reap finishes it).
    """
    if not HAVE_PROC:
        for pgid in pgids:
            _killpg(pgid)
        return
    scanner = _scanner()
    own = {os.getpid(), os.getpgrp()}
    for _ in range(_ROUNDS):
        found = [p for p in await scanner.scan() if p.pid not in own and chosen(p)]
        if not found:
            return
        for process in found:
            if process.pgid in pgids and process.pgid not in own:
                _killpg(process.pgid)
            if sweep:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(process.pid, signal.SIGKILL)
        if not sweep:
            return
        await trio.sleep(_PAUSE_SECONDS)


def _killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class Scanner:
    """Shares ``/proc`` scans between the callers of one Trio run: each gets the
    result of a scan begun after it asked (what it killed before asking is
    not reported alive), and callers asking while a scan runs share the next."""

    def __init__(self, scan: Callable[[], list[Marked]] = scan) -> None:
        self._scan_fn = scan
        self._started = 0  # scans begun
        self._finished = 0  # scans ended (successfully or not)
        self._succeeded = 0  # number of the latest scan that succeeded
        self._result: list[Marked] = []
        self._scanning = False
        self._changed = trio.Event()

    async def scan(self) -> list[Marked]:
        """The marked processes per a scan begun after this call; the error of a
        failed scan reaches the caller that ran it, the others run another."""
        needed = self._started + 1
        while self._succeeded < needed:
            if self._scanning:
                await self._changed.wait()
                continue
            if self._finished >= needed:
                needed = self._started + 1  # the scan that would have served us failed
            await self._run()
        return self._result

    async def _run(self) -> None:
        self._scanning = True
        self._started += 1
        number = self._started
        try:
            self._result = await trio.to_thread.run_sync(self._scan_fn, abandon_on_cancel=True)
            self._succeeded = number
        finally:
            self._finished = number
            self._scanning = False
            self._changed.set()
            self._changed = trio.Event()


_SCANNER: trio.lowlevel.RunVar[Scanner] = trio.lowlevel.RunVar("agentcompass_local_scanner")


def _scanner() -> Scanner:
    try:
        return _SCANNER.get()
    except LookupError:
        scanner = Scanner()
        _SCANNER.set(scanner)
        return scanner
