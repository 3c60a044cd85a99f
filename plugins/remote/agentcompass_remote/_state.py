"""The server's state directory: what a server killed with SIGKILL left open.

A session's sandbox outlives a server killed with SIGKILL (its directory, the
processes it left running); the drivers that used it cannot reap it until a
server answers at that address again. So each running server keeps, in a
directory of its own under the state directory (``<pid>-<random>``), a
``lock`` file it holds an exclusive ``flock`` on for its whole life, and one
``<session>.json`` per open session: its name, the provider config it was
opened with and the provider's handle. A record is durable (written, fsynced,
renamed, the directory fsynced) before the client hears of the session, and
removed once the session's close succeeded.

A server starting with the same state directory tries the lock of every other
server directory there; the kernel releases a lock when its holder dies, so
one it gets belonged to a dead server. Every session of a dead server of the
same provider is then reaped through the provider's ``reap``, before the new
server accepts a connection. A record whose reap failed stays for the next
start. Several live servers may share a state directory: their locks keep
them apart, and a server only reaps what servers of its own provider left.

Non-goal: a server killed after its provider opened a sandbox and before the
record is on disk leaves that sandbox unrecorded; the driver never heard of
it either, and sweeps it by its run's tag.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from agentcompass.host import FileLock

from ._listen import log

__all__ = ["StateDir", "default_state_dir"]

_LOCK = "lock"
_INFO = "server.json"


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/agentcompass/sandbox-serve`` (``~/.local/state/...``)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "agentcompass" / "sandbox-serve"


def _write_durably(directory: Path, name: str, data: bytes) -> None:
    temp = directory / f".{name}.{secrets.token_hex(4)}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, directory / name)
    _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _try_lock(path: Path) -> FileLock | None:
    """An exclusive lock on ``path``, or None when another process holds it."""
    try:
        return FileLock.try_acquire(path, mode=0o600)
    except OSError:
        return None


def _make_own(root: Path, provider: str) -> tuple[Path, FileLock]:
    """This server's directory, locked before it gets its final name (so no
    other server ever sees it unlocked)."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    instance = f"{os.getpid()}-{secrets.token_hex(4)}"
    staging = root / f".{instance}"
    staging.mkdir(mode=0o700)
    lock = _try_lock(staging / _LOCK)
    if lock is None:
        raise OSError(f"cannot lock {staging / _LOCK}")
    _write_durably(staging, _INFO, json.dumps({"provider": provider, "pid": os.getpid()}).encode())
    own = root / instance
    os.rename(staging, own)
    _fsync_dir(root)
    return own, lock


def _remove_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        for entry in directory.iterdir():
            entry.unlink()
        directory.rmdir()


def _dead_servers(root: Path, own: Path) -> list[tuple[Path, FileLock]]:
    """The directories of dead servers under ``root``, each locked now."""
    found = []
    for directory in sorted(root.iterdir()):
        # A dot-name is a server being made (or killed while it was): it records nothing yet.
        if directory == own or directory.name.startswith(".") or not directory.is_dir() or directory.is_symlink():
            continue
        lock = _try_lock(directory / _LOCK)
        if lock is not None:
            found.append((directory, lock))
    return found


def _read_leftovers(directory: Path, provider: str) -> list[tuple[Path, dict[str, Any]]] | None:
    """The session records of a dead server of ``provider``; None when it
    served another provider (left for a server of that one)."""
    try:
        info = json.loads((directory / _INFO).read_text())
    except (OSError, ValueError):
        info = {}
    if info.get("provider") != provider:
        return None
    records = []
    for path in sorted(directory.glob("*.json")):
        if path.name == _INFO:
            continue
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            path.unlink(missing_ok=True)  # a torn write is never a record: rename is atomic
            continue
        if isinstance(record, dict) and isinstance(record.get("handle"), dict):
            records.append((path, record))
    return records


@attrs.define(eq=False)
class StateDir:
    """This server's part of a state directory (see the module docstring).
    Made by :meth:`open`; :meth:`close` when the server stops."""

    root: Path
    own: Path
    _lock: FileLock
    _limiter: trio.CapacityLimiter

    @classmethod
    async def open(cls, root: Path, provider: str) -> StateDir:
        own, lock = await trio.to_thread.run_sync(_make_own, root, provider, abandon_on_cancel=False)
        return cls(root, own, lock, trio.CapacityLimiter(4))

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        # Never abandoned: a record is either on disk whole or not at all.
        return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=False, limiter=self._limiter)

    async def record(self, session_id: str, record: dict[str, Any]) -> None:
        """Record an open session durably (before the client is told): its
        ``name``, the provider ``config`` and ``handle``, and, once it has
        one, the ``scratch`` directory of what was exposed to it. Written
        again whole when it changes."""
        data = json.dumps({"session": session_id, **record}).encode()
        await self._run(_write_durably, self.own, f"{session_id}.json", data)

    async def forget(self, session_id: str) -> None:
        """Drop the record of a session whose close succeeded. Not fsynced:
        a record that comes back after a crash is reaped again, harmlessly."""
        await self._run(lambda: (self.own / f"{session_id}.json").unlink(missing_ok=True))

    async def reap_leftovers(self, provider: str, reap: Callable[[dict[str, Any]], Awaitable[None]]) -> int:
        """Reap every session a dead server of ``provider`` left, with
        ``reap(record)``; return how many were reaped."""
        reaped = 0
        for directory, lock in await self._run(_dead_servers, self.root, self.own):
            try:
                leftovers = await self._run(_read_leftovers, directory, provider)
                if leftovers is None:
                    continue
                failed = False
                for path, record in leftovers:
                    try:
                        await reap(record)
                    except Exception as exc:  # noqa: BLE001 - kept for the next start, and said so
                        failed = True
                        log.warning("could not reap session %s left by %s: %s", record.get("name"), directory, exc)
                        continue
                    reaped += 1
                    await self._run(path.unlink, True)
                if not failed:
                    await self._run(_remove_dir, directory)
            finally:
                lock.release()
        return reaped

    async def close(self) -> None:
        """Release this server's directory: removed when every session of
        it closed, else left (locked no more) for the next start to reap."""

        def release() -> None:
            try:
                if not any(p.name != _INFO and p.suffix == ".json" for p in self.own.iterdir()):
                    _remove_dir(self.own)
            finally:
                self._lock.release()

        await self._run(release)
