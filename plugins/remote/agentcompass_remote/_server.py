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

One hosted session's requests are served by ``_hosted``; what each
operation does on the provider's session is ``_operations``.

Non-goals: TLS (put the server behind a TLS terminator and use ``wss://``)
and reattaching to a session after its connection dropped.
"""

from __future__ import annotations

import hmac
import itertools
import json
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
)
from agentcompass import build_component as _build_component

from . import _expose
from . import _protocol as p
from ._hosted import Hosted, SessionLoop
from ._listen import Admission, accept_loop, log
from ._operations import error_reply, open_session, output_limit, parse_policy
from ._state import StateDir

__all__ = ["SandboxServer", "serve_sandboxes"]


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
    sessions: dict[str, Hosted] = attrs.field(factory=dict, init=False)
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
            log.warning("connection failed: %s", error_reply(None, group.exceptions[0])["message"])
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
        policy = parse_policy(message.get("policy"))
        plan = ExecutionPlan(
            task_id=str(message.get("task_id") or name),
            attempt=0,
            environment=ComponentRef(self.provider, {**config, **self.default_config}),
            baseline_network_policy=parse_policy(policies.get("baseline", message.get("policy"))),
            run_network_policy=parse_policy(policies.get("run", message.get("policy"))),
            evaluation_network_policy=parse_policy(policies.get("evaluation", message.get("policy"))),
            sandbox=p.sandbox_from_message(message.get("sandbox")),
        )
        self._opening += 1
        self.peak_load = max(self.peak_load, self.load)
        session: EnvironmentSession | None = None
        hosted: Hosted | None = None
        try:
            try:
                backend = self._backend(config)  # a bad provider_config is this open's error
                session = await open_session(backend, backend.build_config(plan), policy, name)
            except Exception as exc:
                await ws.send_message(p.encode(error_reply(None, exc)))
                return
            finally:
                self._opening -= 1
            record = {"name": name, "config": {**config, **self.default_config}, "handle": session.handle}
            hosted = Hosted(name, f"{name}.{next(self._ids)}", session, trio.CancelScope(), record)
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
                "output_limit": output_limit(backend, session),
            }
            await ws.send_message(p.encode(opened))
            with hosted.scope:
                await SessionLoop(ws, hosted, self.max_file_bytes, self._state).serve()
        finally:
            await self._end_session(ws, name, session, hosted)

    async def _end_session(
        self,
        ws: trio_websocket.WebSocketConnection,
        name: str,
        session: EnvironmentSession | None,
        hosted: Hosted | None,
    ) -> None:
        """Close a hosted session on every way out of :meth:`_host`, within
        the grace: the provider's close, the exposed copies, the state
        record, then the client told whether the sandbox is gone."""
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
            await ws.send_message(p.encode(error_reply(None, exc)))
            await ws.aclose(code, "protocol error" if code == 1008 else "server error")
        except trio_websocket.ConnectionClosed:
            pass


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
