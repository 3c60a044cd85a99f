"""One ``remote`` session: requests over the session's own connection.

Operations run one at a time over its :class:`~._exchange.Exchange` (see
there how a cancelled operation or a lost connection is handled).

Relayed sockets (``expose_socket``, ``expose_directory``: see ``_relay``
and ``_expose``) are pumped by tasks of the operation that reads the
connection: a session owns no background task (it outlives every nursery
of its caller), so a relayed connection moves while an operation runs (an
agent's model calls happen during the ``exec`` that runs it) and waits,
within its windows, between operations.
"""

from __future__ import annotations

import os
import posixpath
import stat
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from agentcompass import EnvironmentSession, ExecResult, IssueError, NetworkPolicy
from agentcompass.runtime import (
    DEFAULT_MAX_READ_BYTES,
    OutputCallback,
    OutputStream,
    exec_keeping_tails,
)

from . import _expose
from . import _protocol as p
from ._client import ClientConnection, ConnectionLost
from ._exchange import Exchange
from ._failures import check_path, fail, reason
from ._pool import PoolServer

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["RemoteSession"]

#: When the server's provider sends its final text rather than raw output
#: (no ``output_limit``), the client keeps at most this multiple of the
#: configured limit per stream (decoding with replacement characters can grow
#: text up to 3 x).
_OUTPUT_SLACK = 4
_STREAMS: dict[int, OutputStream] = {p.STDOUT: "stdout", p.STDERR: "stderr"}


class RemoteSession(EnvironmentSession):
    """One session on a server. Its connection is its lifetime: closing the
    session, or losing the connection, ends the sandbox on the server."""

    def __init__(
        self,
        server: PoolServer,
        conn: ClientConnection,
        name: str,
        reply: dict[str, Any],
        *,
        max_output: int,
        retry_down_seconds: float,
    ):
        self._server = server
        self._max_output = max_output
        self._exchange = Exchange(conn, name, server.url, partial(server.mark_down, retry_down_seconds))
        self._handle = {"url": server.url, "name": name, "session": reply.get("session")}
        inner = reply.get("handle")
        if isinstance(inner, dict):
            self._handle["inner"] = inner
        limit = reply.get("output_limit")
        # Raw output is cut as the provider cuts it; final text only bounded.
        self._output_limit = limit if isinstance(limit, int) and limit > 0 else max_output * _OUTPUT_SLACK

    @property
    def handle(self) -> dict[str, Any]:
        return dict(self._handle)

    async def exec(
        self,
        cmd: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        """Run ``cmd`` on the server's provider: the same semantics as that
        provider's ``exec`` (timeout, cancellation, output limit and marker),
        the output streamed back and only its tail kept."""
        return await exec_keeping_tails(self.exec_stream, self._output_limit, cmd, timeout, cwd, env)

    async def exec_stream(
        self,
        cmd: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        *,
        on_output: OutputCallback,
    ) -> ExecResult:
        """Run ``cmd`` on the server's provider, handing output to
        ``on_output`` as the server forwards it (see
        :meth:`EnvironmentSession.exec_stream`). With a provider that streams
        (``local``) chunks arrive while the command runs, and a slow
        ``on_output`` slows the command down through the connection; with
        one that does not, they arrive as its final text when it exits."""

        async def on_chunk(kind: int, payload: bytes) -> None:
            stream = _STREAMS.get(kind)
            if stream is None:
                raise p.ProtocolError(f"unknown output stream {kind}")
            await on_output(stream, payload)

        message = {"type": "exec", "cmd": cmd, "timeout": timeout, "cwd": cwd, "env": env}
        reply = await self._exchange.request(message, on_chunk)
        exit_code = reply.get("exit_code")
        if reply["type"] != "exit" or not isinstance(exit_code, int):
            raise fail(f"unexpected reply {reply['type']!r} to exec")
        return ExecResult(exit_code=exit_code, timed_out=bool(reply.get("timed_out")))

    async def exec_private(
        self,
        cmd: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        *,
        directory: str,
        max_bytes: int,
        inputs: Mapping[str, bytes] | None = None,
    ) -> tuple[ExecResult, dict[str, bytes]]:
        """The server's provider's ``exec_private`` (see
        :meth:`EnvironmentSession.exec_private`): its result and the files it
        brought back, ``max_bytes`` capped by the server's own limit. The
        ``inputs`` travel as file data after the request (at most the
        server's ``max_file_bytes`` in all). A provider without it raises
        :exc:`NotImplementedError`, and so does this."""
        check_path(directory)
        listed = []
        for path, content in (inputs or {}).items():
            check_path(path)
            if not isinstance(content, bytes | bytearray | memoryview):
                raise ValueError(f"input {path!r} is not bytes but {type(content).__name__}")
            listed.append((path, bytes(content)))
        streams = {p.STDOUT: bytearray(), p.STDERR: bytearray(), p.FILE: bytearray()}
        bounds = {p.STDOUT: self._max_output * _OUTPUT_SLACK, p.FILE: max_bytes}
        bounds[p.STDERR] = bounds[p.STDOUT]

        async def keep(kind: int, payload: bytes) -> None:
            received = streams.get(kind)
            if received is None or len(received) + len(payload) > bounds[kind]:
                raise p.ProtocolError(f"exec_private sent more than asked for (kind {kind})")
            received += payload

        message: dict[str, Any] = {
            "type": "exec_private",
            "cmd": cmd,
            "timeout": timeout,
            "cwd": cwd,
            "env": env,
            "directory": directory,
            "max_bytes": max_bytes,
        }
        if listed:  # absent for none: a request as before inputs existed
            message["inputs"] = [[path, len(content)] for path, content in listed]
        reply = await self._exchange.request(
            message, keep, b"".join(content for _, content in listed) if listed else None
        )
        exit_code, sizes = reply.get("exit_code"), reply.get("files")
        if reply["type"] != "private_exit" or not isinstance(exit_code, int) or not isinstance(sizes, list):
            raise fail(f"unexpected reply {reply['type']!r} to exec_private")
        files: dict[str, bytes] = {}
        data, offset = streams[p.FILE], 0
        for entry in sizes:
            if not (
                isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str) and isinstance(entry[1], int)
            ):
                raise fail("exec_private: a malformed list of files")
            path, size = entry
            files[path] = bytes(data[offset : offset + size])
            offset += size
        if offset != len(data):
            raise fail("exec_private: the files do not add up to the data sent")
        result = ExecResult(
            exit_code=exit_code,
            stdout=streams[p.STDOUT].decode("utf-8", errors="surrogateescape"),
            stderr=streams[p.STDERR].decode("utf-8", errors="surrogateescape"),
            timed_out=bool(reply.get("timed_out")),
        )
        return result, files

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """Read a regular file of at most ``max_bytes`` (None: the runtime's
        default), which the server caps by its own limit; the server's
        provider raises :class:`~agentcompass.FileRefusedError` (a link on
        the way, not a regular file, too large), and so does this. Paths as
        the server's provider takes them; ``..`` out of the session and
        absolute paths outside ``/app``, ``/tests``, ``/logs``, ``/solution``
        are refused."""
        check_path(path)
        limit = DEFAULT_MAX_READ_BYTES if max_bytes is None else max_bytes
        chunks: list[bytes] = []
        size = 0

        async def keep(_kind: int, payload: bytes) -> None:
            nonlocal size
            size += len(payload)
            if size > limit:
                raise p.ProtocolError(f"the server sent more than the {limit} bytes asked for")
            chunks.append(payload)

        await self._exchange.request({"type": "read_file", "path": path, "max_bytes": max_bytes}, keep)
        return b"".join(chunks)

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Write a file (``str`` as UTF-8), sent in chunks."""
        check_path(path)
        payload = data.encode() if isinstance(data, str) else bytes(data)
        await self._exchange.request({"type": "write_file", "path": path, "size": len(payload)}, data=payload)

    async def set_network_policy(self, policy: NetworkPolicy) -> None:
        await self._exchange.request({"type": "policy", "policy": p.policy_message(policy)})

    async def expose_directory(self, host_path: str) -> str:
        """Make the host directory ``host_path`` visible read-only in the
        session, on the server (which shares no filesystem with this host):

        - an entry of this host's agent cache (``agentcompass.agents.cache_root()``)
          is served from the server's own entry of that name, when its
          ``installed.json`` records the same install (build timings aside);
          otherwise FATAL ``environment_unsupported`` naming the command that
          installs it there. Nothing is copied, and no other server path can
          be asked for.
        - any other directory is copied, when it is small: regular files and
          unix sockets only, no link followed, at most 4 MiB and 64 entries
          (else :exc:`NotImplementedError` naming what was refused). Each
          unix socket in it becomes a relay: a socket of the same name on the
          server, every connection to which is carried over this session's
          connection to the host's socket (see ``expose_socket``).

        The copy, its relays and the provider's exposure go with the session."""
        if not posixpath.isabs(host_path):
            raise ValueError(f"expose_directory needs an absolute path, got {host_path!r}")
        cached = await trio.to_thread.run_sync(_expose.cache_entry_name, host_path)
        if cached is not None:
            name, info = cached
            reply = await self._exchange.request({"type": "expose_cached", "entry": name, "installed": info})
            return self._exposed(reply, host_path)
        files, sockets = await trio.to_thread.run_sync(_expose.list_small_directory, host_path)
        return await self._expose_copy(host_path, files, sockets)

    async def expose_socket(self, host_path: str) -> str:
        """Make the host unix socket ``host_path`` connectable in the session:
        its directory is exposed as :meth:`expose_directory` copies one (so
        the files beside it, such as the model gateway's ``forward.py``, are
        there too), or, when that directory cannot be copied, the socket
        alone in a directory of its own. Connections to it are relayed over
        the session's connection (flow-controlled per connection, at most 32
        at once) and move while an operation of the session runs."""
        if not posixpath.isabs(host_path):
            raise ValueError(f"expose_socket needs an absolute path, got {host_path!r}")
        directory, name = posixpath.split(posixpath.normpath(host_path))
        if not await trio.to_thread.run_sync(_is_socket, host_path):
            raise ValueError(f"{host_path} is not a unix socket")
        try:
            files, sockets = await trio.to_thread.run_sync(_expose.list_small_directory, directory)
        except NotImplementedError:
            files, sockets = [], [name]
        return posixpath.join(await self._expose_copy(directory, files, sockets), name)

    async def _expose_copy(self, directory: str, files: list[tuple[str, bytes, bool]], sockets: list[str]) -> str:
        message = {
            "type": "expose",
            "files": [[path, len(data), executable] for path, data, executable in files],
            "sockets": sockets,
        }
        reply = await self._exchange.request(message, data=b"".join(data for _, data, _ in files))
        return self._exposed(reply, directory)

    def _exposed(self, reply: dict[str, Any], directory: str) -> str:
        """The path of an ``exposed`` reply; its relays are registered."""
        path, relays = reply.get("path"), reply.get("relays")
        if reply["type"] != "exposed" or not isinstance(path, str) or not isinstance(relays, list):
            raise fail(f"unexpected reply {reply['type']!r} to expose")
        for entry in relays:
            if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], int)):
                raise fail("expose: a malformed list of relays")
            self._exchange.channels.relays[entry[1]] = os.path.join(directory, str(entry[0]))
        return path

    async def close(self) -> None:
        """Ask the server to close the session and wait until it has.
        Idempotent. Returns only when the server said the sandbox is gone
        (in answer, or unprompted after a reap or sweep). A close that
        failed on the server, or one the server never confirmed (the
        connection was lost: a server killed with SIGKILL leaves its
        sandboxes), is a WARNING ``cleanup_failed``, so the runtime keeps
        the session reapable. If this is cancelled, the connection is
        dropped, and the server closes the session on its own within its
        grace."""
        x = self._exchange
        if x.closed:
            return
        x.closed = True
        self._server.session_closed()
        conn = x.conn
        where = f"sandbox server {self._server.url}"
        if conn.closed:
            x.channels.close_all()
            if x.ended:
                return
            raise IssueError(
                "warning", "cleanup_failed", f"{where}: the connection was lost; the session may be left there"
            )
        error = None
        try:
            async with x.lock:
                await conn.send({"type": "close"})
                while True:
                    message = await conn.receive()
                    if isinstance(message, dict) and message["type"] == "closed":
                        error = message.get("error")
                        break
        except (ConnectionLost, p.ProtocolError) as exc:
            error = f"{reason(exc)}, and the close was never confirmed; the session may be left there"
        finally:
            x.channels.close_all()
            await conn.abort()
        if error:
            raise IssueError("warning", "cleanup_failed", f"{where}: {error}")


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False
