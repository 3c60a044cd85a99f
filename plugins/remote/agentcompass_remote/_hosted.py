"""One session the server hosts: its state (:class:`Hosted`) and the loop
that reads its client's requests, receives the bytes that follow them and
runs each operation as a task of its own (:class:`SessionLoop`)."""

from __future__ import annotations

import os
import socket
from typing import Any

import attrs
import trio
import trio_websocket

from agentcompass import EnvironmentSession, IssueError
from agentcompass.runtime import DEFAULT_MAX_READ_BYTES

from . import _expose
from . import _protocol as p
from ._operations import (
    accept_relay,
    error_reply,
    expose_cached,
    parse_policy,
    read,
    run_exec,
    run_exec_private,
    set_policy,
    write,
)
from ._relay import CONTROL, MAX_CHANNELS, MAX_RELAYS, Channels
from ._state import StateDir

__all__ = ["Hosted", "SessionLoop"]


@attrs.define(eq=False)
class Hosted:
    """A session the server hosts: the backend's session and how to stop it."""

    name: str
    session_id: str
    backend: EnvironmentSession
    scope: trio.CancelScope
    record: dict[str, Any] = attrs.Factory(dict)
    closed: trio.Event = attrs.Factory(trio.Event)
    #: Relayed connections (``expose``), and the directory holding what was exposed.
    channels: Channels = attrs.Factory(Channels)
    scratch: str | None = None
    exposed: int = 0
    #: One ``expose`` at a time: the directory and the relay limit are checked, then made.
    exposing: trio.Lock = attrs.Factory(trio.Lock)


@attrs.define(eq=False)
class SessionLoop:
    """Serves one hosted session's connection until ``close`` or a dropped
    connection. ``max_file_bytes`` caps what a client may send or read;
    ``state`` records the directories exposed copies go to (None: nowhere)."""

    ws: trio_websocket.WebSocketConnection
    hosted: Hosted
    max_file_bytes: int
    state: StateDir | None = None
    #: operation id -> the scope of its running task
    running: dict[int, trio.CancelScope] = attrs.Factory(dict)
    _nursery: trio.Nursery | None = None
    _outbox: trio.MemorySendChannel[dict[str, Any] | bytes] | None = None

    async def serve(self) -> None:
        """Read the client's requests; operations run as tasks so that
        ``cancel`` can reach a running exec."""
        # Operations hand their messages to one writer over an unbuffered
        # channel: a cancelled operation never cuts a frame in half, and an
        # operation waits while the client is slow (backpressure, no queue).
        outbox, outgoing = trio.open_memory_channel[dict[str, Any] | bytes](0)
        self._outbox = outbox
        channels = self.hosted.channels
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._write, outgoing)
            while True:
                message = await self.ws.get_message()
                if isinstance(message, bytes):
                    _relayed_data(channels, message)
                    continue
                request = p.decode(message)
                kind, op = request["type"], request.get("id")
                if kind in CONTROL:
                    channels.control(request)
                elif kind == "close":
                    nursery.cancel_scope.cancel()
                    return
                elif not isinstance(op, int) or op < 0 or op in self.running:
                    raise p.ProtocolError(f"operation id {op!r} is missing or in use")
                elif kind == "cancel":
                    target = request.get("target")
                    if target in self.running:
                        self.running[target].cancel()
                else:
                    await self._operation(kind, op, request)

    async def send(self, message: dict[str, Any] | bytes) -> None:
        assert self._outbox is not None
        await self._outbox.send(message)

    async def _write(self, outgoing: trio.MemoryReceiveChannel[dict[str, Any] | bytes]) -> None:
        async for message in outgoing:
            await self.ws.send_message(p.encode(message) if isinstance(message, dict) else message)

    async def _operation(self, kind: str, op: int, request: dict[str, Any]) -> None:
        """Start operation ``op``, once the bytes that follow its request are in."""
        ws, hosted, channels = self.ws, self.hosted, self.hosted.channels
        session = hosted.backend
        if kind == "exec":
            self._start(op, run_exec, session, request)
        elif kind == "exec_private":
            limit = self._read_limit(request.get("max_bytes"))
            inputs = await self._receive_inputs(ws, op, request.get("inputs"), channels)
            self._start(op, run_exec_private, session, request, limit, inputs)
        elif kind == "read_file":
            self._start(op, read, session, request.get("path"), self._read_limit(request.get("max_bytes")))
        elif kind == "write_file":
            data = await self._receive_file(ws, op, request, "write_file", channels)
            self._start(op, write, session, request.get("path"), data)
        elif kind == "policy":
            self._start(op, set_policy, session, parse_policy(request.get("policy")))
        elif kind == "expose":
            files, sockets = _expose.check_listing(request.get("files"), request.get("sockets"), _expose.COPY_MAX_BYTES)
            data = await self._receive_file(ws, op, {"size": sum(size for _, size, _ in files)}, "expose", channels)
            assert self._nursery is not None
            self._start(op, self._expose, hosted, self._nursery, files, data, sockets)
        elif kind == "expose_cached":
            self._start(op, expose_cached, session, request.get("entry"), request.get("installed"))
        else:
            raise p.ProtocolError(f"unknown operation {kind!r}")

    def _start(self, op: int, fn: Any, *args: Any) -> None:
        # Registered before the task starts, so a cancel right behind the request finds it.
        scope = self.running[op] = trio.CancelScope()
        assert self._nursery is not None
        self._nursery.start_soon(self._run, op, scope, fn, *args)

    async def _run(self, op: int, scope: trio.CancelScope, fn: Any, *args: Any) -> None:
        with scope:
            try:
                await fn(self.send, op, *args)
            except Exception as exc:
                await self.send(error_reply(op, exc))
            finally:
                del self.running[op]
        if scope.cancelled_caught:
            await self.send({"type": "cancelled", "id": op})

    def _read_limit(self, max_bytes: Any) -> int:
        """The client's ``max_bytes`` of a ``read_file`` or ``exec_private``
        (None: the runtime's default), capped by the server's own limit."""
        if max_bytes is None:
            max_bytes = DEFAULT_MAX_READ_BYTES
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 0:
            raise p.ProtocolError(f"read_file max_bytes {max_bytes!r} is not a byte count")
        return min(max_bytes, self.max_file_bytes)

    async def _receive_inputs(
        self, ws: trio_websocket.WebSocketConnection, op: int, listed: Any, channels: Channels
    ) -> dict[str, bytes]:
        """The files an ``exec_private`` names in ``inputs`` (``[[path,
        size], ...]``, absent for none), whose bytes follow it in that order,
        at most ``max_file_bytes`` in all."""
        if listed is None:
            return {}
        if not isinstance(listed, list):
            raise p.ProtocolError("exec_private inputs must be a list of [path, size]")
        sizes: dict[str, int] = {}
        for entry in listed:
            if not (isinstance(entry, list) and len(entry) == 2):
                raise p.ProtocolError("exec_private inputs must be a list of [path, size]")
            path, size = entry
            p.check_path(path, "input")
            if not path.startswith("/") or path in sizes:
                raise p.ProtocolError(f"input {path!r} is not absolute, or is named twice")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise p.ProtocolError(f"input {path!r} size {size!r} is not a byte count")
            sizes[path] = size
        data = await self._receive_file(ws, op, {"size": sum(sizes.values())}, "exec_private inputs", channels)
        inputs, offset = {}, 0
        for path, size in sizes.items():
            inputs[path] = data[offset : offset + size]
            offset += size
        return inputs

    async def _receive_file(
        self,
        ws: trio_websocket.WebSocketConnection,
        op: int,
        request: dict[str, Any],
        what: str = "write_file",
        channels: Channels | None = None,
    ) -> bytes:
        size = request.get("size")
        if not isinstance(size, int) or not 0 <= size <= self.max_file_bytes:
            raise p.ProtocolError(f"{what} size {size!r} is not between 0 and {self.max_file_bytes}")
        data = bytearray()
        while len(data) < size:
            chunk = await ws.get_message()
            if not isinstance(chunk, bytes):
                control = p.decode(chunk)
                if control["type"] not in CONTROL or channels is None:
                    raise p.ProtocolError("expected file data")
                channels.control(control)
                continue
            chunk_op, kind, payload = p.unpack_chunk(chunk)
            if kind == p.CHANNEL and channels is not None:
                channels.data(chunk_op, payload)  # relayed bytes may cross the request on the wire
                continue
            if chunk_op != op or kind != p.FILE or len(data) + len(payload) > size:
                raise p.ProtocolError(f"file data does not match its {what}")
            data += payload
        return bytes(data)

    # -- expose ---------------------------------------------------------------

    async def _expose(
        self,
        send: Any,
        op: int,
        hosted: Hosted,
        nursery: trio.Nursery,
        files: list[tuple[str, int, bool]],
        data: bytes,
        sockets: list[str],
    ) -> None:
        """Write the client's copy into a fresh directory of the session's
        own, listen on a relay for each socket it named, and have the
        provider's session expose the directory."""
        async with hosted.exposing:
            await self._expose_locked(send, op, hosted, nursery, files, data, sockets)

    async def _expose_locked(
        self,
        send: Any,
        op: int,
        hosted: Hosted,
        nursery: trio.Nursery,
        files: list[tuple[str, int, bool]],
        data: bytes,
        sockets: list[str],
    ) -> None:
        channels = hosted.channels
        if len(channels.relays) + len(sockets) > MAX_RELAYS:
            raise IssueError("fatal", "environment_failed", f"a session relays at most {MAX_RELAYS} sockets")
        if hosted.scratch is None:
            hosted.scratch = await trio.to_thread.run_sync(_expose.make_scratch)
            if self.state is not None:
                # Recorded before anything is made in it: a reap after a SIGKILL removes it.
                hosted.record["scratch"] = hosted.scratch
                await self.state.record(hosted.session_id, hosted.record)
        hosted.exposed += 1
        directory = os.path.join(hosted.scratch, str(hosted.exposed))
        contents, offset = [], 0
        for path, size, executable in files:
            contents.append((path, data[offset : offset + size], executable))
            offset += size
        await trio.to_thread.run_sync(_expose.write_copy, directory, contents)
        listeners: list[tuple[str, int, trio.socket.SocketType]] = []
        try:
            for path in sockets:
                listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                listeners.append((path, channels.next_id(), listener))
                target = os.path.join(directory, path)
                await trio.to_thread.run_sync(os.makedirs, os.path.dirname(target), 0o755, True)
                await listener.bind(target)
                os.chmod(target, 0o666)  # the session's user connects; only this session sees it
                listener.listen(MAX_CHANNELS)
            inside = await hosted.backend.expose_directory(directory)
        except BaseException:
            for _, _, listener in listeners:
                listener.close()
            raise
        for path, relay, _ in listeners:
            channels.relays[relay] = os.path.join(directory, path)
        try:
            relays = [[path, relay] for path, relay, _ in listeners]
            await send({"type": "exposed", "id": op, "path": inside, "relays": relays})
        except BaseException:
            for _, _, listener in listeners:
                listener.close()
            raise
        # Accepting only now: a channel is never announced before its relay.
        for _, relay, listener in listeners:
            nursery.start_soon(accept_relay, listener, relay, channels, send, nursery)


def _relayed_data(channels: Channels, message: bytes) -> None:
    """Binary data between operations: only a relayed channel's."""
    channel, kind, payload = p.unpack_chunk(message)
    if kind != p.CHANNEL:
        raise p.ProtocolError("binary data outside a write_file")
    channels.data(channel, payload)
