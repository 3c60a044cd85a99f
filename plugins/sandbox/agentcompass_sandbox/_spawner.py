"""The runtime's side of the spawner process (protocol in :mod:`._zygote`).

One spawner per runtime process, started at the first :func:`spawn` and
restarted if it died; it ends when the runtime does. Several requests may
be in flight at once and their replies come in any order: each carries its
request's id, and whichever waiting task reads a reply files it for the
caller waiting on that id. (The bookkeeping is per Trio run: one run at a
time uses the spawner, as a runtime does.)
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import attrs
import trio

from agentcompass.runtime import cleanup_deadline

from ._host import HOST_UID, STATE_ROOT, USERLAND, HostError, cgroup_bases

#: How long a spawn may take (an exec and bwrap's start: milliseconds) before the spawner counts as stuck.
_REPLY_SECONDS = 10.0
_SCRIPT = Path(__file__).with_name("_zygote.py")


@attrs.define(eq=False)
class _Spawner:
    sock: socket.socket
    proc: subprocess.Popen[bytes]


_start_lock = threading.Lock()
#: The running spawner of each uid bwrap runs as (the host's nobody, or the images' root).
_current: dict[int, _Spawner] = {}
_ids = itertools.count()
_programs: dict[str, str] = {}


@attrs.define(eq=False)
class _Exchange:
    """One Trio run's requests in flight: one task at a time sends, and one
    at a time reads, filing every reply under its id for its caller."""

    send_lock: trio.Lock = attrs.Factory(trio.Lock)
    replies: dict[int, dict[str, object]] = attrs.Factory(dict)
    reading: bool = False
    arrived: trio.Event = attrs.Factory(trio.Event)


_exchange: trio.lowlevel.RunVar[_Exchange] = trio.lowlevel.RunVar("agentcompass_sandbox_spawn_exchange")


def _start(uid: int = HOST_UID) -> _Spawner:
    """Blocking: the running spawner of ``uid``, started if there is none (or it died)."""
    with _start_lock:
        current = _current.get(uid)
        if current is not None and current.proc.poll() is None:
            return current
        if current is not None:
            current.sock.close()
        # What bwrap reads from: /proc, the device nodes, the userland, the
        # state directory; and the cgroups the spawner writes.
        keep = ["/proc", "/dev", str(STATE_ROOT), *(f"/{entry}" for entry in USERLAND)]
        keep += [str(base) for base in cgroup_bases().values()]
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(_SCRIPT), str(theirs.fileno()), str(uid), str(uid)],
                pass_fds=(theirs.fileno(),),
                env={},  # nothing of the runtime's environment, which may hold keys
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.send(json.dumps(keep).encode())
        ours.setblocking(False)
        _current[uid] = _Spawner(ours, proc)
        return _current[uid]


def _prepare(program: str, uid: int = HOST_UID) -> _Spawner:
    """Blocking: :func:`_start`, and where ``program`` is on ``PATH``."""
    if program not in _programs:
        found = shutil.which(program)
        if found is None:
            raise HostError(f"{program} is not on PATH")
        _programs[program] = found
    return _start(uid)


def _this_run() -> _Exchange:
    try:
        return _exchange.get()
    except LookupError:
        exchange = _Exchange()
        _exchange.set(exchange)
        return exchange


async def spawn(
    argv: list[str],
    fds: list[int],
    cgroups: list[str],
    netns: int | None = None,
    env: dict[str, str] | None = None,
    *,
    uid: int = HOST_UID,
    idmap: tuple[int, int, int] | None = None,
) -> tuple[int, int]:
    """Start bwrap (``argv``, which must pass ``--info-fd 3 --block-fd 4``)
    as the host's ``nobody`` with no supplementary groups, with ``env`` as its
    whole environment (none: empty). ``fds`` are the
    child's 0, 1, 2, 3 (write end of the info pipe) and 4 (read end of the
    block pipe), then the other ends of those two pipes, for the spawner.
    Bwrap and its child in the sandbox are moved into the cgroups whose
    ``cgroup.procs`` files are ``cgroups`` before the child starts anything.
    Return (bwrap's pid, its child's pid); they are children of the spawner,
    not of the runtime. Raise :class:`HostError` when bwrap did not start.
    Every descriptor of ``fds`` is closed here (once handed over, or on
    failure): the spawner sees bwrap fail by its info pipe ending. With
    ``netns`` (a descriptor of a network namespace, which stays the
    caller's), bwrap starts inside that namespace. With ``uid``, bwrap runs
    as that host uid (a spawner per uid); with ``idmap`` (``inside, outside,
    count``; ``argv`` must pass ``--unshare-user --userns-block-fd 4``) the
    spawner writes that uid and gid map of bwrap's user namespace before
    letting it go on.

    Requests from concurrent callers are in flight together. Once a request
    is sent, its reply is awaited even under cancellation (bounded), so a
    caller never loses track of a process it started."""
    open_fds = list(fds)
    try:
        spawner = _current.get(uid)
        if spawner is None or spawner.proc.poll() is not None or argv[0] not in _programs:
            spawner = await trio.to_thread.run_sync(_prepare, argv[0], uid)
        request_id = next(_ids)
        argv = [_programs[argv[0]], *argv[1:]]
        request = {"id": request_id, "argv": argv, "env": env or {}, "cgroups": cgroups, "netns": netns is not None}
        if idmap is not None:
            request["idmap"] = list(idmap)
        message = json.dumps(request)
        exchange = _this_run()
        async with exchange.send_lock:
            await _send(spawner.sock, message.encode(), fds if netns is None else [*fds, netns])
        while open_fds:
            os.close(open_fds.pop())
        # Shielded so that a cancelled open still learns the pid it must clean
        # up, and bounded by the run's one cleanup deadline as well.
        with trio.move_on_at(min(trio.current_time() + _REPLY_SECONDS, cleanup_deadline()), shield=True):
            reply = await _receive(spawner.sock, exchange, request_id)
            if "pid" in reply:
                return int(reply["pid"]), int(reply["child_pid"])  # type: ignore[call-overload]
            raise HostError(f"could not start {argv[0]}: {reply.get('error')}")
        exchange.replies.pop(request_id, None)
        raise HostError(f"the sandbox spawner did not answer within {_REPLY_SECONDS:.0f} s or the cleanup grace")
    finally:
        while open_fds:
            os.close(open_fds.pop())


async def _send(sock: socket.socket, message: bytes, fds: list[int]) -> None:
    while True:
        try:
            socket.send_fds(sock, [message], fds)
            return
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)
        except OSError as exc:
            raise HostError(f"the sandbox spawner is gone: {exc}") from None


async def _receive(sock: socket.socket, exchange: _Exchange, request_id: int) -> dict[str, object]:
    while request_id not in exchange.replies:
        if exchange.reading:
            await exchange.arrived.wait()
            continue
        exchange.reading = True
        try:
            reply = json.loads(await _receive_one(sock))
        finally:
            exchange.reading = False
            arrived, exchange.arrived = exchange.arrived, trio.Event()
            arrived.set()
        exchange.replies[reply["id"]] = reply
    return exchange.replies.pop(request_id)


async def _receive_one(sock: socket.socket) -> bytes:
    while True:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)
            continue
        except OSError as exc:
            raise HostError(f"the sandbox spawner is gone: {exc}") from None
        if not data:
            raise HostError("the sandbox spawner exited")
        return data
