"""``compass sandbox serve``: hosts sandbox sessions of a local provider over WebSocket.

Each connection authenticates first (the token, compared in constant time;
the WebSocket upgrade and the hello within ``auth_timeout`` seconds of the
accept, at most ``max_unauthenticated`` connections at a time in that state:
see ``_listen``) and then does one thing: host one session (``open``), or
``reap`` / ``sweep`` by session name. A session
lives exactly as long as its connection: when the client closes it, or the
connection drops (a driver killed mid-exec), the server cancels what the
session was doing and closes it within ``grace`` seconds, so a dead driver
leaks nothing. Cancelling :func:`serve_sandboxes` (SIGTERM in the CLI) closes
every session the same way. With a ``state_dir``, every open session is
recorded there until it is closed, and a server starting on the same
directory first reaps what a server killed with SIGKILL left (see ``_state``).

Non-goals: TLS (put the server behind a TLS terminator and use ``wss://``)
and reattaching to a session after its connection dropped.
"""

from __future__ import annotations

import hmac
import inspect
import itertools
import json
import os
import socket
from pathlib import Path
from typing import Any

import attrs
import trio
import trio_websocket

from agentcompass import (
    BaseEnvironment,
    ComponentRef,
    EnvironmentSession,
    ExecutionPlan,
    FileRefusedError,
    IssueError,
    NetworkPolicy,
)
from agentcompass import build_component as _build_component
from agentcompass.runtime import DEFAULT_MAX_READ_BYTES

from . import _expose
from . import _protocol as p
from ._listen import Admission, accept_loop, log
from ._relay import CONTROL, MAX_CHANNELS, MAX_RELAYS, Channel, Channels
from ._state import StateDir

__all__ = ["SandboxServer", "serve_sandboxes"]


def _policy(raw: Any) -> NetworkPolicy:
    if not isinstance(raw, dict) or raw.get("mode") not in ("none", "allowlist", "full"):
        raise p.ProtocolError(f"not a network policy: {raw!r}")
    allow = raw.get("allow") or []
    if not isinstance(allow, list) or not all(isinstance(a, str) for a in allow):
        raise p.ProtocolError(f"not a network policy: {raw!r}")
    return NetworkPolicy(raw["mode"], tuple(allow))


def _error(op: int | None, exc: BaseException) -> dict[str, Any]:
    """An operation's failure as a message (one line, no traceback)."""
    message = " ".join(str(exc).split()) or type(exc).__name__
    reply: dict[str, Any] = {"type": "error", "id": op, "severity": "fatal", "code": "environment_failed"}
    if isinstance(exc, FileRefusedError):
        # What the session made, not a failure of the server: the client raises it as such.
        reply.update(code=p.FILE_REFUSED, message=message)
    elif isinstance(exc, NotImplementedError):
        # An optional operation the provider lacks (``exec_private``): the caller falls back.
        reply.update(code=p.NOT_IMPLEMENTED, message=message)
    elif isinstance(exc, IssueError):
        reply.update(severity=exc.severity, code=exc.code, message=exc.message)
    elif isinstance(exc, OSError) and exc.errno is not None:
        reply.update(errno=exc.errno, message=exc.strerror or message)
    else:
        reply["message"] = message
    return reply


@attrs.define(eq=False)
class _Hosted:
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
class SandboxServer:
    """The state of one server: its backend provider, token, limits and sessions.

    - ``provider``: the id of the registered Environment that hosts sessions.
    - ``token``: what clients must send; never logged or echoed.
    - ``capacity``: most sessions at once (0: no limit), advertised to clients.
    - ``grace``: seconds a session's close may take once its client is gone.
    - ``auth_timeout``: seconds from accept by which a client must have
      upgraded to WebSocket and sent a good hello; else it is hung up on.
    - ``max_unauthenticated``: most connections not authenticated yet at once
      (0: no limit); one more is closed at once.
    - ``max_message_bytes``: larger messages close the connection (code 1009).
    - ``max_file_bytes``: largest file a client may write or read (a client's
      ``max_bytes`` is capped by it).
    - ``state_dir``: where open sessions are recorded for the next start to
      reap after a SIGKILL (None: nowhere, and nothing is reaped on start).
    - ``default_config``: the provider config; a client's ``provider_config``
      fills in keys it does not set (the server's own settings win).
    """

    provider: str
    token: str
    capacity: int = 0
    grace: float = 10.0
    auth_timeout: float = 5.0
    max_unauthenticated: int = 1024
    max_message_bytes: int = p.MAX_MESSAGE_BYTES + p.HEADER.size
    max_file_bytes: int = 256 * 1024 * 1024
    default_config: dict[str, Any] = attrs.Factory(dict)
    state_dir: Path | None = None
    sessions: dict[str, _Hosted] = attrs.field(factory=dict, init=False)
    #: Sessions opened since the server started, and the most open at once.
    opened_total: int = attrs.field(default=0, init=False)
    peak_load: int = attrs.field(default=0, init=False)
    _opening: int = attrs.field(default=0, init=False)
    _backends: dict[str, BaseEnvironment] = attrs.field(factory=dict, init=False)
    _ids: Any = attrs.field(factory=lambda: itertools.count(1), init=False)
    admission: Admission = attrs.field(init=False)
    _state: StateDir | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        if not self.token:
            raise ValueError("the server refuses to start without a token")
        self._backend({})  # an unknown provider id fails now, not at the first open
        self.admission = Admission(self.max_unauthenticated)

    @property
    def load(self) -> int:
        return len(self.sessions) + self._opening

    def _backend(self, config: dict[str, Any]) -> BaseEnvironment:
        config = {**config, **self.default_config}
        key = json.dumps(config, sort_keys=True)
        backend = self._backends.get(key)
        if backend is None:
            backend = self._backends[key] = _build_component("environment", self.provider, config)
        return backend

    # -- connections ---------------------------------------------------------

    async def serve_connection(self, stream: trio.SocketStream) -> None:
        """One accepted connection, from accept to close. Until its hello
        checks out it holds a place in :attr:`admission` and lives under one
        deadline, ``auth_timeout`` from now; never raises."""
        authenticated = False
        try:
            async with trio.open_nursery() as nursery:  # trio-websocket's reader task runs here
                ws: trio_websocket.WebSocketConnection | None = None
                hello: str | bytes | None = None
                with trio.move_on_after(self.auth_timeout):
                    request = await trio_websocket.wrap_server_stream(
                        nursery, stream, max_message_size=self.max_message_bytes, receive_buffer_size=p.CHUNK
                    )
                    ws = await request.accept()
                    hello = await ws.get_message()
                if ws is None:  # no WebSocket in time: hang up without a word
                    nursery.cancel_scope.cancel()
                    return
                try:
                    refusal = self._refusal(hello)
                    if refusal is not None:
                        with trio.move_on_after(_REFUSAL_SECONDS):
                            await ws.aclose(*refusal)
                        return
                    self.admission.leave()
                    authenticated = True
                    await self._serve_client(ws)
                finally:
                    with trio.move_on_after(self.grace):
                        await ws.aclose()
                    nursery.cancel_scope.cancel()
        except* (trio_websocket.ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the peer went away (or never spoke WebSocket)
        except* Exception as group:
            log.warning("connection failed: %s", _error(None, group.exceptions[0])["message"])
        finally:
            if not authenticated:
                self.admission.leave()
            await trio.aclose_forcefully(stream)

    async def _serve_client(self, ws: trio_websocket.WebSocketConnection) -> None:
        """An authenticated connection: its one request."""
        try:
            await ws.send_message(
                p.encode(
                    {
                        "type": "welcome",
                        "version": p.VERSION,
                        "provider": self.provider,
                        "capacity": self.capacity,
                        "load": self.load,
                    }
                )
            )
            first = p.decode(await ws.get_message())
            kind = first["type"]
            if kind == "open":
                await self._host(ws, first)
            elif kind == "reap":
                found = await self._reap(str(first.get("name")), first.get("handle"))
                await ws.send_message(p.encode({"type": "reaped", "found": found}))
            elif kind == "sweep":
                count = await self._sweep(first.get("tag"))
                await ws.send_message(p.encode({"type": "swept", "count": count}))
            elif kind != "bye":
                raise p.ProtocolError(f"unexpected message {kind!r}")
        except* trio_websocket.ConnectionClosed:
            pass  # the client went away; its session (if any) is closed already
        except* p.ProtocolError as group:
            # A confused or hostile client: say why, and hang up.
            await _hang_up(ws, group.exceptions[0], 1008)
        except* Exception as group:
            # Whatever else failed serving this connection must not take the server down.
            await _hang_up(ws, group.exceptions[0], 1011)

    def _refusal(self, hello: str | bytes | None) -> tuple[int, str] | None:
        """None for a good hello, else the close code and reason: a
        constant-time token check (any malformed hello is a plain refusal),
        then the protocol version, named only to a client with the token."""
        refused = (4001, "authentication failed")
        if not isinstance(hello, str):
            return refused
        try:
            message = p.decode(hello)
        except p.ProtocolError:
            return refused
        token = message.get("token")
        if message["type"] != "hello" or not isinstance(token, str):
            return refused
        if not hmac.compare_digest(token.encode(), self.token.encode()):
            return refused
        version = message.get("version")
        if version != p.VERSION:
            return p.WRONG_VERSION, f"the client speaks protocol version {str(version)[:20]}, this server {p.VERSION}"
        return None

    # -- one hosted session --------------------------------------------------

    async def _host(self, ws: trio_websocket.WebSocketConnection, message: dict[str, Any]) -> None:
        name = message.get("name")
        if not isinstance(name, str) or not p.NAME_RE.fullmatch(name):
            raise p.ProtocolError(f"session name {name!r} must match [a-z0-9-]{{1,40}}")
        if message.get("provider") != self.provider:
            await ws.send_message(
                p.encode(
                    {
                        "type": "error",
                        "id": None,
                        "severity": "fatal",
                        "code": "environment_failed",
                        "message": f"this server hosts {self.provider!r} sessions, not {message.get('provider')!r}",
                    }
                )
            )
            return
        if name in self.sessions:
            raise p.ProtocolError(f"a session named {name!r} is already open")
        if self.capacity and self.load >= self.capacity:
            await ws.send_message(p.encode({"type": "full", "capacity": self.capacity, "load": self.load}))
            return
        config = message.get("provider_config") or {}
        policies = message.get("policies") or {}
        if not isinstance(config, dict) or not isinstance(policies, dict):
            raise p.ProtocolError("provider_config and policies must be objects")
        policy = _policy(message.get("policy"))
        plan = ExecutionPlan(
            task_id=str(message.get("task_id") or name),
            attempt=0,
            environment=ComponentRef(self.provider, {**config, **self.default_config}),
            baseline_network_policy=_policy(policies.get("baseline", message.get("policy"))),
            run_network_policy=_policy(policies.get("run", message.get("policy"))),
            evaluation_network_policy=_policy(policies.get("evaluation", message.get("policy"))),
            sandbox=p.sandbox_from_message(message.get("sandbox")),
        )
        self._opening += 1
        self.peak_load = max(self.peak_load, self.load)
        session: EnvironmentSession | None = None
        hosted: _Hosted | None = None
        try:
            try:
                backend = self._backend(config)  # a bad provider_config is this open's error
                session = await _open(backend, backend.build_config(plan), policy, name)
            except Exception as exc:
                await ws.send_message(p.encode(_error(None, exc)))
                return
            finally:
                self._opening -= 1
            record = {"name": name, "config": {**config, **self.default_config}, "handle": session.handle}
            hosted = _Hosted(name, f"{name}.{next(self._ids)}", session, trio.CancelScope(), record)
            self.sessions[name] = hosted
            self.opened_total += 1
            if self._state is not None:
                # On disk before the client hears of it: a SIGKILL from here on
                # leaves a record the next start reaps.
                await self._state.record(hosted.session_id, record)
            opened = {
                "type": "opened",
                "session": hosted.session_id,
                "handle": session.handle,
                "output_limit": _output_limit(backend, session),
            }
            await ws.send_message(p.encode(opened))
            with hosted.scope:
                await self._serve_session(ws, hosted)
        finally:
            grace_deadline = trio.current_time() + self.grace
            close_error = None
            if session is not None:
                with trio.move_on_at(grace_deadline, shield=True) as grace:
                    try:
                        await session.close()
                    except Exception as exc:  # noqa: BLE001 - the client is told below when it still listens
                        close_error = " ".join(str(exc).split()) or type(exc).__name__
                if grace.cancelled_caught:
                    close_error = f"closing the session took longer than the server's {self.grace}s grace"
                if hosted is not None:
                    # After the provider's close: nothing of the session holds the directory now.
                    hosted.channels.close_all()
                    if hosted.scratch is not None and close_error is None:
                        with trio.move_on_at(grace_deadline, shield=True) as removal:
                            await trio.to_thread.run_sync(_expose.remove_scratch, hosted.scratch)
                        if removal.cancelled_caught:
                            close_error = f"removing {hosted.scratch} took longer than the server's {self.grace}s grace"
                if close_error is None and hosted is not None and self._state is not None:
                    with trio.move_on_at(grace_deadline, shield=True):
                        await self._state.forget(hosted.session_id)
            if hosted is not None:
                self.sessions.pop(name, None)
                hosted.closed.set()
                # Shielded, and on every way out: a server shutting down still
                # tells its client whether the sandbox is gone (a client told
                # nothing must assume it was left behind).
                with trio.move_on_at(grace_deadline, shield=True):
                    try:
                        await ws.send_message(p.encode({"type": "closed", "error": close_error}))
                    except trio_websocket.ConnectionClosed:
                        pass

    async def _serve_session(self, ws: trio_websocket.WebSocketConnection, hosted: _Hosted) -> None:
        """Read the client's requests until ``close`` or a dropped connection.
        Operations run as tasks so that ``cancel`` can reach a running exec."""
        running: dict[int, trio.CancelScope] = {}
        # Operations hand their messages to one writer over an unbuffered
        # channel: a cancelled operation never cuts a frame in half, and an
        # operation waits while the client is slow (backpressure, no queue).
        outbox, outgoing = trio.open_memory_channel[dict[str, Any] | bytes](0)

        async def send(message: dict[str, Any] | bytes) -> None:
            await outbox.send(message)

        async def write() -> None:
            async for message in outgoing:
                await ws.send_message(p.encode(message) if isinstance(message, dict) else message)

        async def run(op: int, scope: trio.CancelScope, fn: Any, *args: Any) -> None:
            with scope:
                try:
                    await fn(send, op, *args)
                except Exception as exc:
                    await send(_error(op, exc))
                finally:
                    del running[op]
            if scope.cancelled_caught:
                await send({"type": "cancelled", "id": op})

        def start(op: int, fn: Any, *args: Any) -> None:
            # Registered before the task starts, so a cancel right behind the request finds it.
            running[op] = trio.CancelScope()
            nursery.start_soon(run, op, running[op], fn, *args)

        channels = hosted.channels
        async with trio.open_nursery() as nursery:
            nursery.start_soon(write)
            while True:
                message = await ws.get_message()
                if isinstance(message, bytes):
                    channel, kind, payload = p.unpack_chunk(message)
                    if kind != p.CHANNEL:
                        raise p.ProtocolError("binary data outside a write_file")
                    channels.data(channel, payload)
                    continue
                request = p.decode(message)
                kind, op = request["type"], request.get("id")
                if kind in CONTROL:
                    channels.control(request)
                    continue
                if kind == "close":
                    nursery.cancel_scope.cancel()
                    return
                if not isinstance(op, int) or op < 0 or op in running:
                    raise p.ProtocolError(f"operation id {op!r} is missing or in use")
                if kind == "cancel":
                    target = request.get("target")
                    if target in running:
                        running[target].cancel()
                    continue
                session = hosted.backend
                if kind == "exec":
                    start(op, _exec, session, request)
                elif kind == "exec_private":
                    limit = self._read_limit(request.get("max_bytes"))
                    inputs = await self._receive_inputs(ws, op, request.get("inputs"), channels)
                    start(op, _exec_private, session, request, limit, inputs)
                elif kind == "read_file":
                    start(op, _read, session, request.get("path"), self._read_limit(request.get("max_bytes")))
                elif kind == "write_file":
                    data = await self._receive_file(ws, op, request, "write_file", channels)
                    start(op, _write, session, request.get("path"), data)
                elif kind == "policy":
                    start(op, _set_policy, session, _policy(request.get("policy")))
                elif kind == "expose":
                    files, sockets = _expose.check_listing(
                        request.get("files"), request.get("sockets"), _expose.COPY_MAX_BYTES
                    )
                    data = await self._receive_file(
                        ws, op, {"size": sum(size for _, size, _ in files)}, "expose", channels
                    )
                    start(op, self._expose, hosted, nursery, files, data, sockets)
                elif kind == "expose_cached":
                    start(op, _expose_cached, session, request.get("entry"), request.get("installed"))
                else:
                    raise p.ProtocolError(f"unknown operation {kind!r}")

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
        hosted: _Hosted,
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
        hosted: _Hosted,
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
            if self._state is not None:
                # Recorded before anything is made in it: a reap after a SIGKILL removes it.
                hosted.record["scratch"] = hosted.scratch
                await self._state.record(hosted.session_id, hosted.record)
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
            nursery.start_soon(_accept_relay, listener, relay, channels, send, nursery)

    # -- reap and sweep ------------------------------------------------------

    async def _reap(self, name: str, handle: Any) -> bool:
        """Close the live session ``name``; failing that, hand the provider's
        handle to the provider's ``reap``: the sandbox of a session this
        server hosted before it was killed and restarted. (The provider
        destroys only what it recognises as its own, and an authenticated
        client can run commands anyway.)"""
        hosted = self.sessions.get(name)
        if hosted is not None:
            hosted.scope.cancel()
            await hosted.closed.wait()
            return True
        if isinstance(handle, dict):
            await self._backend({}).reap(handle)
        return False

    async def _reap_leftover(self, record: dict[str, Any]) -> None:
        """Reap a sandbox a killed server of this provider recorded, with
        the provider config it was opened with, then the directory its
        exposed copies were in."""
        backend = _build_component("environment", self.provider, record.get("config") or {})
        with trio.fail_after(self.grace):
            await backend.reap(record["handle"])
        scratch = record.get("scratch")
        if isinstance(scratch, str):
            with trio.fail_after(self.grace):
                await trio.to_thread.run_sync(_expose.remove_scratch, scratch)

    async def _sweep(self, tag: Any) -> int:
        if not isinstance(tag, str) or not p.NAME_RE.fullmatch(tag):
            raise p.ProtocolError(f"sweep tag {tag!r} must match [a-z0-9-]{{1,40}}")
        doomed = [h for name, h in self.sessions.items() if name.startswith(tag)]
        for hosted in doomed:
            hosted.scope.cancel()
        for hosted in doomed:
            await hosted.closed.wait()
        for backend in self._backends.values():
            sweep = getattr(backend, "sweep", None)
            if sweep is not None:
                await sweep(tag)
        return len(doomed)


#: How long a refused client gets to answer the closing handshake.
_REFUSAL_SECONDS = 1.0


async def _hang_up(ws: trio_websocket.WebSocketConnection, exc: BaseException, code: int) -> None:
    with trio.move_on_after(1):
        try:
            await ws.send_message(p.encode(_error(None, exc)))
            await ws.aclose(code, "protocol error" if code == 1008 else "server error")
        except trio_websocket.ConnectionClosed:
            pass


async def _open(backend: BaseEnvironment, config: Any, policy: NetworkPolicy, name: str) -> EnvironmentSession:
    """The backend's ``open``, passing the session name to providers that take it."""
    if "name" in inspect.signature(backend.open).parameters:
        return await backend.open(config, policy, name=name)  # type: ignore[call-arg]
    return await backend.open(config, policy)


def _output_limit(backend: BaseEnvironment, session: EnvironmentSession) -> int | None:
    """The per-stream limit the client applies to streamed exec output: the
    provider's ``max_output_bytes`` when the session streams raw output (its
    own ``exec_stream``); ``None`` when the output arrives as the provider's
    final, already truncated text (the default ``exec_stream``)."""
    if type(session).exec_stream is EnvironmentSession.exec_stream:
        return None
    limit = getattr(getattr(backend, "options", None), "max_output_bytes", None)
    return limit if isinstance(limit, int) and limit > 0 else None


def _exec_args(request: dict[str, Any]) -> tuple[str | list[str], float | None, str | None, dict[str, str] | None]:
    """``cmd``, ``timeout``, ``cwd`` and ``env`` of an exec request, checked."""
    cmd = request.get("cmd")
    if not (isinstance(cmd, str) or (isinstance(cmd, list) and cmd and all(isinstance(a, str) for a in cmd))):
        raise p.ProtocolError("cmd must be a string or a non-empty list of strings")
    cwd = request.get("cwd")
    if cwd is not None:
        p.check_path(cwd, "cwd")
    env = request.get("env")
    if env is not None and not (isinstance(env, dict) and all(isinstance(v, str) for v in env.values())):
        raise p.ProtocolError("env must map names to strings")
    timeout = request.get("timeout")
    if timeout is not None and not isinstance(timeout, int | float):
        raise p.ProtocolError("timeout must be a number")
    return cmd, timeout, cwd, env


async def _exec(send: Any, op: int, session: EnvironmentSession, request: dict[str, Any]) -> None:
    cmd, timeout, cwd, env = _exec_args(request)

    async def forward(stream: str, chunk: bytes) -> None:
        # Awaiting the send is the backpressure: a slow client stalls the command's pipe.
        kind = p.STDOUT if stream == "stdout" else p.STDERR
        data = memoryview(chunk)
        for start in range(0, len(data), p.OUTPUT_CHUNK):
            await send(p.pack_chunk(op, kind, data[start : start + p.OUTPUT_CHUNK]))

    result = await session.exec_stream(cmd, timeout, cwd, env, on_output=forward)
    await send({"type": "exit", "id": op, "exit_code": result.exit_code, "timed_out": result.timed_out})


async def _send_data(send: Any, op: int, kind: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    for start in range(0, len(view), p.OUTPUT_CHUNK):
        await send(p.pack_chunk(op, kind, view[start : start + p.OUTPUT_CHUNK]))


async def _exec_private(
    send: Any, op: int, session: EnvironmentSession, request: dict[str, Any], max_bytes: int, inputs: dict[str, bytes]
) -> None:
    """The backend's ``exec_private`` with the client's inputs: its output,
    then the files it brought back (their bytes in the order of the final
    message's ``files``)."""
    cmd, timeout, cwd, env = _exec_args(request)
    directory = p.check_path(request.get("directory"), "directory")
    options: dict[str, Any] = {"directory": directory, "max_bytes": max_bytes}
    if inputs:  # providers written before inputs keep working without them
        options["inputs"] = inputs
    result, files = await session.exec_private(cmd, timeout, cwd, env, **options)
    await _send_data(send, op, p.STDOUT, result.stdout.encode("utf-8", errors="surrogateescape"))
    await _send_data(send, op, p.STDERR, result.stderr.encode("utf-8", errors="surrogateescape"))
    sizes = []
    for path, content in files.items():
        await _send_data(send, op, p.FILE, content)
        sizes.append([path, len(content)])
    final = {"type": "private_exit", "id": op, "exit_code": result.exit_code, "timed_out": result.timed_out}
    await send({**final, "files": sizes})


async def _accept_relay(
    listener: trio.socket.SocketType, relay: int, channels: Channels, send: Any, nursery: trio.Nursery
) -> None:
    """Every connection to a relay's socket becomes a channel, up to the
    session's limit (one more is closed at once); ends with the session."""
    with listener:
        while True:
            try:
                sock, _ = await listener.accept()
            except OSError as exc:
                log.warning("relay %d: accept failed: %s", relay, exc)
                await trio.sleep(0.1)  # out of descriptors: the connection waits in the backlog
                continue
            if len(channels.open) >= MAX_CHANNELS:
                sock.close()
                continue
            channel = Channel(channels.next_id(), sock)
            channels.open[channel.id] = channel
            await send({"type": "channel", "relay": relay, "channel": channel.id})
            nursery.start_soon(channels.serve, channel, send)


async def _expose_cached(send: Any, op: int, session: EnvironmentSession, entry: Any, installed: Any) -> None:
    """Expose this server's own agent cache entry ``entry`` when it is the
    client's install (see ``_expose.server_entry``)."""
    path = await trio.to_thread.run_sync(_expose.server_entry, entry, installed)
    inside = await session.expose_directory(path)
    await send({"type": "exposed", "id": op, "path": inside, "relays": []})


async def _read(send: Any, op: int, session: EnvironmentSession, path: Any, max_bytes: int) -> None:
    path = p.check_path(path)
    if "max_bytes" in inspect.signature(session.read_file).parameters:
        content = await session.read_file(path, max_bytes)
    else:  # a provider written before max_bytes: the cap is applied here
        content = await session.read_file(path)
    if len(content) > max_bytes:
        raise FileRefusedError(f"{path!r} is larger than {max_bytes} bytes")
    data = memoryview(content)
    for start in range(0, len(data), p.OUTPUT_CHUNK):
        await send(p.pack_chunk(op, p.FILE, data[start : start + p.OUTPUT_CHUNK]))
    await send({"type": "done", "id": op, "size": len(data)})


async def _write(send: Any, op: int, session: EnvironmentSession, path: Any, data: bytes) -> None:
    await session.write_file(p.check_path(path), data)
    await send({"type": "done", "id": op})


async def _set_policy(send: Any, op: int, session: EnvironmentSession, policy: NetworkPolicy) -> None:
    await session.set_network_policy(policy)
    await send({"type": "done", "id": op})


async def serve_sandboxes(
    server: SandboxServer,
    host: str,
    port: int,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``server`` on ``host:port`` until cancelled; ``nursery.start``
    returns the bound port (useful with port 0). Cancelling it closes every
    session, each bounded by the server's grace.

    With a ``state_dir``, what servers killed on that directory left is
    reaped first, before the port is even bound; a reap that fails is logged
    and retried at the next start.

    Connections use TCP keepalive, so a driver whose machine vanished without
    closing its connections (power loss, a partition) is noticed within
    about half a minute and its sessions closed like any other."""
    if server.state_dir is not None:
        server._state = await StateDir.open(server.state_dir, server.provider)
    try:
        if server._state is not None:
            reaped = await server._state.reap_leftovers(server.provider, server._reap_leftover)
            if reaped:
                log.warning("reaped %d session(s) left by a server killed on %s", reaped, server.state_dir)
        listeners = await trio.open_tcp_listeners(port, host=host)
        for listener in listeners:
            p.set_keepalive(listener.socket)  # accepted connections inherit it
        async with trio.open_nursery() as nursery:
            for listener in listeners:
                nursery.start_soon(accept_loop, listener, server.admission, server.serve_connection, nursery)
            task_status.started(listeners[0].socket.getsockname()[1])
    finally:
        if server._state is not None:
            with trio.move_on_after(server.grace, shield=True):
                await server._state.close()
            server._state = None
