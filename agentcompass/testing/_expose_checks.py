"""The conformance kit's exposure checks: what ``expose_directory`` and
``expose_socket`` promise (SPEC 4) on a provider whose sessions are
isolated from the host's filesystem (``sandbox``, ``docker``; not
``local``, whose sessions run on the host's files and may be handed the
host path itself).

- :func:`check_exposed_directory`: the exposed directory is readable and
  executable inside, never writable nor remountable, by the session's
  user whoever that is (root included); nothing of the host beside it is
  reachable through its parent; closing leaves no mount naming the session
  and the host's directory as it was.
- :func:`check_exposed_socket`: under policy ``none``, a unix socket
  exposed from the host is connectable from inside (the client is
  ``python3`` where the session has one, else ``perl``); closing keeps the
  host's socket.
- :func:`check_sweep_detaches_exposures`: a runtime killed while a session
  had exposures leaves mounts of the host's directory; ``sweep`` of the
  session's tag (by ``sweeper``, a fresh provider as a new runtime would
  have) detaches every one and never deletes through them.

Each raises ``AssertionError`` naming the check and what was seen. They
need what the provider needs to expose (root, for the built-in ones), run
real sessions under the real clock, and take ``scratch``, a host directory
of the test's (made traversable by everyone: the session's user must reach
what is exposed), and ``tag``, the prefix of the session names they use.
"""

from __future__ import annotations

import os
import secrets
import shlex
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from agentcompass.runtime import BaseEnvironment, EnvironmentSession, NetworkPolicy

__all__ = ["check_exposed_directory", "check_exposed_socket", "check_sweep_detaches_exposures"]

_NONE = NetworkPolicy("none")
_SECONDS = 120
_CLOSE_SECONDS = 30

#: What a session tries against an exposed directory ``{inside}``; each must fail.
_ATTACKS = (
    "echo x > {inside}/tool.txt",
    "touch {inside}/new",
    "rm -f {inside}/tool.txt",
    "chmod 777 {inside}/tool.txt",
    "mkdir {inside}/../planted",
    "mount -o remount,rw {inside}",
    "umount {inside}",
    "umount -l {parent}",
)

_PY_CLIENT = (
    "import socket,sys\n"
    "s=socket.socket(socket.AF_UNIX)\n"
    "s.connect(sys.argv[1])\n"
    "s.sendall(b'ping')\n"
    "s.shutdown(socket.SHUT_WR)\n"
    "sys.stdout.write(s.recv(10).decode())\n"
)
_PL_CLIENT = (
    "use IO::Socket::UNIX; my $s = IO::Socket::UNIX->new(Peer => $ARGV[0]) or die $!;"
    " print $s 'ping'; $s->shutdown(1); print <$s>;"
)


def _host_dir(scratch: str | os.PathLike[str]) -> Path:
    """A fresh host directory to expose: ``tool.txt`` and an executable ``sub/run.sh``."""
    os.chmod(scratch, 0o755)
    shared = Path(scratch) / f"exposed-{secrets.token_hex(4)}"
    (shared / "sub").mkdir(parents=True)
    (shared / "tool.txt").write_text("from the host\n")
    (shared / "sub" / "run.sh").write_text("echo ran\n")
    os.chmod(shared, 0o755)
    os.chmod(shared / "sub", 0o755)
    os.chmod(shared / "sub" / "run.sh", 0o755)
    return shared


def _snapshot(shared: Path) -> dict[str, str]:
    return {str(p.relative_to(shared)): p.read_text() if p.is_file() else "" for p in sorted(shared.rglob("*"))}


def _mounts_naming(name: str) -> list[str]:
    """The host's mount points (this process's view) with a path component ``name``."""
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    return [p for p in points if f"/{name}/" in p + "/"]


@asynccontextmanager
async def _session(
    env: BaseEnvironment, config: Any, policy: NetworkPolicy, name: str
) -> AsyncIterator[EnvironmentSession]:
    session = await env.open(config, policy, name=name)
    try:
        yield session
    finally:
        with trio.move_on_after(_CLOSE_SECONDS, shield=True):
            await session.close()


async def check_exposed_directory(
    env: BaseEnvironment, config: Any, scratch: str | os.PathLike[str], *, tag: str, policy: NetworkPolicy = _NONE
) -> None:
    """``expose_directory``: readable, never writable, nothing else reachable,
    nothing left after close (see the module docstring)."""
    shared = _host_dir(scratch)
    before = _snapshot(shared)
    name = f"{tag}-d"
    with trio.fail_after(_SECONDS):
        async with _session(env, config, policy, name) as session:
            inside = await session.expose_directory(str(shared))
            parent = inside.rstrip("/").rsplit("/", 1)[0] or "/"
            read = await session.exec(f"cat {shlex.quote(inside)}/tool.txt && {shlex.quote(inside)}/sub/run.sh")
            assert (read.stdout, read.exit_code) == ("from the host\nran\n", 0), (
                f"exposed_directory: not readable: {read}"
            )
            for attack in _ATTACKS:
                command = attack.format(inside=shlex.quote(inside), parent=shlex.quote(parent))
                result = await session.exec(command)
                assert result.exit_code != 0, f"exposed_directory: {command!r} succeeded inside the session"
            assert _snapshot(shared) == before, "exposed_directory: the session changed the host's directory"
            listed = (await session.exec(f"ls -A {shlex.quote(parent)}")).stdout.split()
            assert listed == [inside.rstrip("/").rsplit("/", 1)[1]], (
                f"exposed_directory: the exposure's parent {parent} shows {listed}, not the exposure alone"
            )
    assert _mounts_naming(name) == [], f"exposed_directory: mounts left after close: {_mounts_naming(name)}"
    assert _snapshot(shared) == before, "exposed_directory: closing changed the host's directory"


async def check_exposed_socket(env: BaseEnvironment, config: Any, scratch: str | os.PathLike[str], *, tag: str) -> None:
    """``expose_socket`` under policy ``none``: the host's socket answers from inside."""
    os.chmod(scratch, 0o755)
    directory = Path(scratch) / f"sock-{secrets.token_hex(4)}"
    directory.mkdir()
    os.chmod(directory, 0o711)
    path = str(directory / "s")
    listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = f"{tag}-s"
    try:
        await listener.bind(path)
        os.chmod(path, 0o666)
        listener.listen()
        with trio.fail_after(_SECONDS):
            async with _session(env, config, _NONE, name) as session:
                inside = await session.expose_socket(path)
                assert inside.endswith("/s"), f"exposed_socket: {inside!r} does not name the socket"
                client = (
                    "if command -v python3 >/dev/null 2>&1;"
                    f" then exec python3 -c {shlex.quote(_PY_CLIENT)} {shlex.quote(inside)};"
                    f" else exec perl -e {shlex.quote(_PL_CLIENT)} {shlex.quote(inside)}; fi"
                )
                async with trio.open_nursery() as nursery:

                    async def answer() -> None:
                        conn, _ = await listener.accept()
                        with conn:
                            assert await conn.recv(4) == b"ping", "exposed_socket: the client's bytes did not arrive"
                            await conn.send(b"pong")

                    nursery.start_soon(answer)
                    result = await session.exec(client, timeout=30)
                    nursery.cancel_scope.cancel()  # a client that never connected leaves nothing to answer
                assert (result.stdout, result.exit_code) == ("pong", 0), f"exposed_socket: {result}"
    finally:
        listener.close()
    assert _mounts_naming(name) == [], f"exposed_socket: mounts left after close: {_mounts_naming(name)}"
    assert await trio.Path(path).exists(), "exposed_socket: closing removed the host's socket"


async def check_sweep_detaches_exposures(
    env: BaseEnvironment,
    config: Any,
    scratch: str | os.PathLike[str],
    *,
    tag: str,
    sweeper: BaseEnvironment | None = None,
) -> None:
    """``sweep(tag)`` after a killed runtime: every exposure of the session
    detached, the host's directory kept. ``sweeper`` is the provider that
    sweeps (default ``env``)."""
    shared = _host_dir(scratch)
    before = _snapshot(shared)
    name = f"{tag}-w"
    with trio.fail_after(_SECONDS):
        async with _session(env, config, _NONE, name) as session:
            await session.expose_directory(str(shared))
            await session.expose_directory(str(shared))
            await session.expose_socket(str(shared / "tool.txt"))
            assert _mounts_naming(name), "sweep_detaches_exposures: the exposures made no mount to sweep"
            # What a runtime killed now leaves: the sweep of its tag cleans up
            # through the state directory, never by deleting what is bound there.
            await (sweeper or env).sweep(tag)
            left = _mounts_naming(name)
            assert left == [], f"sweep_detaches_exposures: mounts left after sweep({tag!r}): {left}"
    assert _snapshot(shared) == before, "sweep_detaches_exposures: the host's directory changed"
