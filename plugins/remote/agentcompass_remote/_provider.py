"""The ``remote`` Environment: sessions on ``compass sandbox serve`` servers.

Config: ``url`` (``ws://host:port``, or a list of them: a pool), ``token``
(a Secret; ``${ENV_VAR}`` in config), ``provider`` (what the servers host,
default ``local``), ``provider_config`` (that provider's config, default
``{}``), ``connect_timeout_seconds`` (5: a server that does not answer by
then is skipped for this open) and ``retry_down_seconds`` (2: how long a
server that failed is skipped before it is tried again).

Choosing a server: each open goes to the reachable server with the most free
capacity (each advertises its capacity and load when a client connects;
between connections the provider counts its own opens and closes). A server
that refuses the connection or drops is skipped for ``retry_down_seconds``,
then tried first, so a restarted server is used again as soon as it answers.

Failures: losing the connection during a session is FATAL
``environment_failed`` (the runtime retries the attempt, on another server);
so is a pool where no server could open a session. Operations on one session
run one at a time (the connection carries one request at a time).
"""

from __future__ import annotations

import secrets
from collections import deque
from typing import Any, ClassVar, Literal

import attrs
import trio

from agentcompass import (
    BaseEnvironment,
    ComponentError,
    EnvironmentSession,
    ExecResult,
    ExecutionPlan,
    IssueError,
    NetworkPolicy,
    Secret,
    build_component,
    register,
)

from . import _protocol as p
from ._client import ClientConnection, ConnectionLost, parse_url

__all__ = ["RemoteEnvironment", "RemoteSession"]

#: Bounds the shielded exchange that cancels a running exec on the server.
_CANCEL_GRACE_SECONDS = 5.0
#: The client keeps at most this multiple of the backend's output limit per
#: stream (decoding with replacement characters can grow text up to 3 x).
_OUTPUT_SLACK = 4
_DEFAULT_MAX_OUTPUT = 1024 * 1024
#: The free capacity of a server without a limit (so ties break on load).
_UNLIMITED = 10**12


def _fail(message: str) -> IssueError:
    return IssueError("fatal", "environment_failed", message)


def _urls(value: Any) -> tuple[str, ...]:
    urls = (value,) if isinstance(value, str) else tuple(value) if isinstance(value, list) else ()
    if not urls or not all(isinstance(u, str) for u in urls):
        raise ComponentError(f"environment 'remote': url must be a ws:// URL or a non-empty list of them, got {value!r}")
    for url in urls:
        try:
            parse_url(url)
        except ValueError as exc:
            raise ComponentError(f"environment 'remote': {exc}") from None
    if len(set(urls)) != len(urls):
        raise ComponentError("environment 'remote': url lists a server twice")
    return urls


@attrs.define(eq=False)
class _Server:
    """What the provider knows about one server of its pool."""

    url: str
    capacity: int | None = None  # None: never heard from
    load: int = 0  # sessions open there, as last advertised plus our own since
    pending: int = 0  # our opens choosing it right now
    down_until: float = -1.0
    failures: int = 0

    def free(self) -> int:
        """Free capacity as far as we know: a server with no limit, or never
        heard from, counts as very large, less what is open and opening there."""
        capacity = self.capacity or _UNLIMITED
        return capacity - self.load - self.pending

    def mark_down(self, retry_seconds: float) -> None:
        self.failures += 1
        self.down_until = trio.current_time() + retry_seconds * min(2 ** (self.failures - 1), 8)


@register
class RemoteEnvironment(BaseEnvironment):
    """Sandboxes on ``compass sandbox serve`` servers: one, or a pool where
    each open goes to the server with the most free capacity."""

    id: ClassVar[str] = "remote"

    @attrs.frozen
    class Config:
        url: Any = attrs.field(metadata={"doc": "ws://host:port of a server, or a list of them (a pool)"})
        token: Secret | None = attrs.field(default=None, metadata={"doc": "the servers' token, as ${ENV_VAR}"})
        provider: str = attrs.field(default="local", metadata={"doc": "the environment id the servers host"})
        provider_config: dict[str, Any] = attrs.field(factory=dict, metadata={"doc": "that environment's config"})
        connect_timeout_seconds: float = attrs.field(
            default=5.0, validator=attrs.validators.gt(0), metadata={"doc": "skip a server silent this long"}
        )
        retry_down_seconds: float = attrs.field(
            default=2.0, validator=attrs.validators.ge(0), metadata={"doc": "skip a failed server this long"}
        )

    def __init__(self, config: dict[str, Any] | None = None):
        super().__init__(config)
        self._servers = [_Server(url) for url in _urls(self.options.url)]
        self._probe_lock = trio.Lock()
        token = self.options.token
        self._token = token.reveal() if isinstance(token, Secret) else ""
        if not self._token:
            where = f" ({token} is empty or unset)" if isinstance(token, Secret) and token.env_var else ""
            raise ComponentError(f"environment 'remote' needs a token (config key 'token', e.g. '${{COMPASS_TOKEN}}'){where}")
        self._inner: BaseEnvironment | None = None
        max_output = self.options.provider_config.get("max_output_bytes", _DEFAULT_MAX_OUTPUT)
        self._max_output = max_output if isinstance(max_output, int) and max_output > 0 else _DEFAULT_MAX_OUTPUT

    def build_config(self, plan: ExecutionPlan) -> dict[str, Any]:
        """The open config: the plan's phase policies, which the server's
        provider checks before it opens. When that provider is installed here
        too, its ``build_config`` rejects an unenforceable plan now (preflight)."""
        if self._inner is None:
            try:
                self._inner = build_component("environment", self.options.provider, dict(self.options.provider_config))
            except ComponentError as exc:
                if "unknown environment id" not in str(exc):
                    raise
        if self._inner is not None:
            self._inner.build_config(plan)
        return {
            "task_id": plan.task_id,
            "policies": {
                "baseline": _policy(plan.baseline_network_policy),
                "run": _policy(plan.run_network_policy),
                "evaluation": _policy(plan.evaluation_network_policy),
            },
        }

    async def open(self, config: Any, policy: NetworkPolicy, name: str | None = None) -> RemoteSession:
        """Open a session on the best server of the pool (see the module
        docstring); ``name`` labels it on the server (invented when None)."""
        name = name or f"remote-{secrets.token_hex(6)}"
        request = {
            "type": "open",
            "name": name,
            "provider": self.options.provider,
            "provider_config": self.options.provider_config,
            "policy": _policy(policy),
            **(config if isinstance(config, dict) else {}),
        }
        if any(s.capacity is None and s.down_until < 0 for s in self._servers):
            await self._probe()
        refusals: list[str] = []
        for server in self._order():
            server.pending += 1
            try:
                session = await self._open_on(server, request, refusals)
            finally:
                server.pending -= 1
            if session is not None:
                return session
        raise _fail(f"no server of the pool could open session {name!r}: " + "; ".join(refusals))

    async def _probe(self) -> None:
        """Learn the capacity and load of every server not heard from yet
        (once, by the first open; concurrent opens wait for it), so that the
        first opens too go where the most capacity is free."""
        async with self._probe_lock:
            unknown = [s for s in self._servers if s.capacity is None and s.down_until < 0]

            async def probe(server: _Server) -> None:
                try:
                    with trio.fail_after(self.options.connect_timeout_seconds):
                        conn, welcome = await self._connect(server.url, {"type": "bye"})
                except (ConnectionLost, p.ProtocolError, trio.TooSlowError):
                    server.mark_down(self.options.retry_down_seconds)
                    return
                server.capacity, server.load = welcome["capacity"], welcome["load"]
                await conn.abort()

            async with trio.open_nursery() as nursery:
                for server in unknown:
                    nursery.start_soon(probe, server)

    def _order(self) -> list[_Server]:
        """Servers to try, best first: those due to be tried again after a
        failure, then the others by free capacity; servers still skipped last."""
        now = trio.current_time()
        due = [s for s in self._servers if 0 <= s.down_until <= now]
        up = sorted((s for s in self._servers if s.down_until < 0), key=lambda s: -s.free())
        skipped = sorted((s for s in self._servers if s.down_until > now), key=lambda s: s.down_until)
        return due + up + skipped

    async def _open_on(self, server: _Server, request: dict[str, Any], refusals: list[str]) -> RemoteSession | None:
        try:
            with trio.fail_after(self.options.connect_timeout_seconds):
                conn, welcome = await self._connect(server.url, request)
        except (ConnectionLost, p.ProtocolError, trio.TooSlowError) as exc:
            server.mark_down(self.options.retry_down_seconds)
            refusals.append(f"{server.url}: {_reason(exc)}")
            return None
        try:
            server.capacity, server.load = welcome["capacity"], welcome["load"]
            server.down_until, server.failures = -1.0, 0
            reply = await conn.receive_json()
            kind = reply["type"]
            if kind == "opened":
                session = RemoteSession(self, server, conn, request["name"], reply)
                server.load += 1
                return session
            await conn.abort()
            if kind == "full":
                refusals.append(f"{server.url}: full ({reply.get('load')} of {reply.get('capacity')} sessions)")
                return None
            if kind == "error":
                raise _reply_error(reply)
            raise p.ProtocolError(f"unexpected reply {kind!r} to open")
        except (ConnectionLost, p.ProtocolError) as exc:
            await conn.abort()
            server.mark_down(self.options.retry_down_seconds)
            refusals.append(f"{server.url}: {_reason(exc)}")
            return None
        except BaseException:
            await conn.abort()  # the server closes the half-made session when we hang up
            raise

    async def _connect(self, url: str, then: dict[str, Any]) -> tuple[ClientConnection, dict[str, Any]]:
        """Connect, authenticate and send ``then`` in the same write (the
        server reads it only once the token checks out); return the
        connection and the server's welcome."""
        conn = await ClientConnection.connect(url)
        try:
            await conn.send({"type": "hello", "version": p.VERSION, "token": self._token}, then)
            welcome = await conn.receive_json()
            if welcome.get("type") != "welcome" or welcome.get("version") != p.VERSION:
                raise p.ProtocolError(f"the server answered {welcome.get('type')!r} (version {welcome.get('version')!r})")
            if welcome.get("provider") != self.options.provider:
                raise p.ProtocolError(f"the server hosts {welcome.get('provider')!r}, not {self.options.provider!r}")
            return conn, welcome
        except BaseException:
            await conn.abort()
            raise

    async def _ask(self, url: str, request: dict[str, Any]) -> dict[str, Any]:
        """One request on a connection of its own (reap, sweep)."""
        try:
            with trio.fail_after(self.options.connect_timeout_seconds):
                conn, _ = await self._connect(url, request)
        except (ConnectionLost, p.ProtocolError, trio.TooSlowError) as exc:
            raise IssueError("warning", "cleanup_failed", f"sandbox server {url}: {_reason(exc)}") from None
        try:
            reply = await conn.receive_json()
        except (ConnectionLost, p.ProtocolError) as exc:
            raise IssueError("warning", "cleanup_failed", f"sandbox server {url}: {_reason(exc)}") from None
        finally:
            await conn.abort()
        if reply.get("type") == "error":
            raise _reply_error(reply)
        return reply

    async def reap(self, handle: dict[str, Any]) -> None:
        """Close the session named in ``handle`` on its server if it is still
        open, or else have the server's provider reap its sandbox (left by a
        server that was killed, then restarted). Idempotent. Only servers of
        this provider's pool are asked."""
        url, name = handle.get("url"), handle.get("name")
        if url not in {s.url for s in self._servers} or not isinstance(name, str):
            raise IssueError("warning", "cleanup_failed", f"not a session of this pool: {handle!r}")
        await self._ask(url, {"type": "reap", "name": name, "handle": handle.get("inner")})

    async def sweep(self, tag: str) -> None:
        """Close every session whose name starts with ``tag`` on every server
        of the pool (and let each server's provider sweep too). A server that
        cannot be reached is reported after the others are swept."""
        unreachable: list[str] = []
        for server in self._servers:
            try:
                await self._ask(server.url, {"type": "sweep", "tag": tag})
            except IssueError as exc:
                unreachable.append(exc.message)
        if unreachable:
            raise IssueError("warning", "cleanup_failed", "could not sweep: " + "; ".join(unreachable))

    def _closed(self, server: _Server) -> None:
        server.load = max(0, server.load - 1)

    def _lost(self, server: _Server) -> None:
        server.mark_down(self.options.retry_down_seconds)


def _policy(policy: NetworkPolicy) -> dict[str, Any]:
    return {"mode": policy.mode, "allow": list(policy.allow)}


def _check_path(path: str) -> None:
    try:
        p.check_path(path)
    except p.ProtocolError as exc:
        raise _fail(str(exc)) from None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, trio.TooSlowError):
        return "no answer in time"
    return " ".join(str(exc).split()) or type(exc).__name__


def _reply_error(reply: dict[str, Any]) -> Exception:
    message = str(reply.get("message") or "the server reported an error")
    errno = reply.get("errno")
    if isinstance(errno, int):
        return OSError(errno, message)
    severity: Literal["fatal", "error", "warning"] = "fatal"
    if reply.get("severity") in ("error", "warning"):
        severity = reply["severity"]
    return IssueError(severity, str(reply.get("code") or "environment_failed"), message)


class _SessionEnded(Exception):
    """The server closed the session (a reap or sweep from elsewhere)."""


class _Tail:
    """The last ``limit`` bytes received, plus how many came before them."""

    def __init__(self, limit: int):
        self.limit = limit
        self.chunks: deque[bytes] = deque()
        self.size = 0

    def append(self, data: bytes) -> None:
        self.chunks.append(data)
        self.size += len(data)
        while self.chunks and self.size - len(self.chunks[0]) >= self.limit:
            self.size -= len(self.chunks.popleft())

    def text(self) -> str:
        return b"".join(self.chunks)[-self.limit :].decode("utf-8", errors="replace")


class RemoteSession(EnvironmentSession):
    """One session on a server. Its connection is its lifetime: closing the
    session, or losing the connection, ends the sandbox on the server."""

    def __init__(self, env: RemoteEnvironment, server: _Server, conn: ClientConnection, name: str, reply: dict[str, Any]):
        self._env = env
        self._server = server
        self._conn = conn
        self._lock = trio.Lock()
        self._ops = 0
        self._closed = False
        self._handle = {"url": server.url, "name": name, "session": reply.get("session")}
        inner = reply.get("handle")
        if isinstance(inner, dict):
            self._handle["inner"] = inner

    @property
    def handle(self) -> dict[str, Any]:
        return dict(self._handle)

    def _check_open(self) -> None:
        if self._closed:
            raise _fail(f"remote session {self._handle['name']} on {self._server.url} is closed")
        if self._conn.closed:
            raise _fail(f"the connection to {self._server.url} for session {self._handle['name']} was lost")

    async def _request(self, message: dict[str, Any], on_chunk: Any = None, data: bytes | None = None) -> dict[str, Any]:
        """Send one operation and read its replies until it ends. A lost
        connection is FATAL ``environment_failed``; a cancellation asks the
        server to cancel the operation and waits (briefly, shielded) for it."""
        async with self._lock:
            self._check_open()
            self._ops += 1
            op = self._ops
            try:
                if data is None:
                    await self._send({**message, "id": op})
                else:
                    # The request and the first chunk go in one write.
                    view = memoryview(data)
                    first = [p.pack_chunk(op, p.FILE, view[: p.CHUNK])] if view else []
                    await self._send({**message, "id": op}, *first)
                    for start in range(p.CHUNK, len(view), p.CHUNK):
                        await self._send(p.pack_chunk(op, p.FILE, view[start : start + p.CHUNK]))
                reply = await self._until_done(op, on_chunk)
            except _SessionEnded:
                await self._conn.abort()
                raise _fail(f"the server closed session {self._handle['name']} (reaped or swept)") from None
            except (ConnectionLost, p.ProtocolError) as exc:
                await self._conn.abort()
                self._env._lost(self._server)
                raise _fail(f"sandbox server {self._server.url}: {_reason(exc)}") from None
            except BaseException:
                await self._abandon(op)
                raise
        if reply["type"] == "error":
            raise _reply_error(reply)
        return reply

    async def _send(self, *messages: dict[str, Any] | bytes) -> None:
        """Send whole messages even when cancelled (briefly, shielded): a
        write cut short would leave half a frame on the connection and lose
        the session; a cancellation lands at the next receive instead."""
        with trio.move_on_after(_CANCEL_GRACE_SECONDS, shield=True):
            await self._conn.send(*messages)
            return
        await self._conn.abort()
        raise ConnectionLost("a write to the server did not finish")

    async def _until_done(self, op: int, on_chunk: Any) -> dict[str, Any]:
        """Replies of ``op`` up to its last one (``error`` included)."""
        while True:
            message = await self._conn.receive()
            if isinstance(message, bytes):
                chunk_op, kind, payload = p.unpack_chunk(message)
                if chunk_op != op or on_chunk is None:
                    raise p.ProtocolError("unexpected binary data")
                on_chunk(kind, payload)
                continue
            kind = message["type"]
            if kind == "closed":
                raise _SessionEnded
            if message.get("id") != op:
                raise p.ProtocolError(f"a reply for operation {message.get('id')!r} while waiting for {op}")
            return message

    async def _abandon(self, op: int) -> None:
        """The caller gave up on ``op`` (cancelled): cancel it on the server
        and drain its replies, or drop the connection if that overruns."""
        if self._conn.closed:
            return
        with trio.move_on_after(_CANCEL_GRACE_SECONDS, shield=True):
            try:
                self._ops += 1
                await self._conn.send({"type": "cancel", "id": self._ops, "target": op})
                while True:
                    message = await self._conn.receive()
                    if isinstance(message, dict) and (message.get("id") == op or message["type"] == "closed"):
                        if message["type"] != "closed":
                            return  # the operation ended (cancelled, or finished first)
                        break
            except (ConnectionLost, p.ProtocolError):
                pass
        await self._conn.abort()

    async def exec(
        self,
        cmd: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        """Run ``cmd`` on the server's provider: the same semantics as that
        provider's ``exec`` (timeout, cancellation, output limit), the output
        streamed back in chunks."""
        limit = self._env._max_output * _OUTPUT_SLACK
        streams = {p.STDOUT: _Tail(limit), p.STDERR: _Tail(limit)}

        def on_chunk(kind: int, payload: bytes) -> None:
            tail = streams.get(kind)
            if tail is None:
                raise p.ProtocolError(f"unknown output stream {kind}")
            tail.append(payload)

        message = {"type": "exec", "cmd": cmd, "timeout": timeout, "cwd": cwd, "env": env}
        reply = await self._request(message, on_chunk)
        exit_code = reply.get("exit_code")
        if reply["type"] != "exit" or not isinstance(exit_code, int):
            raise _fail(f"unexpected reply {reply['type']!r} to exec")
        return ExecResult(
            exit_code=exit_code,
            stdout=streams[p.STDOUT].text(),
            stderr=streams[p.STDERR].text(),
            timed_out=bool(reply.get("timed_out")),
        )

    async def read_file(self, path: str) -> bytes:
        """Read a file (paths as the server's provider takes them; ``..`` out
        of the session and absolute paths outside ``/app``, ``/tests``,
        ``/logs``, ``/solution`` are refused)."""
        _check_path(path)
        chunks: list[bytes] = []
        await self._request({"type": "read_file", "path": path}, lambda _kind, payload: chunks.append(payload))
        return b"".join(chunks)

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Write a file (``str`` as UTF-8), sent in chunks."""
        _check_path(path)
        payload = data.encode() if isinstance(data, str) else bytes(data)
        await self._request({"type": "write_file", "path": path, "size": len(payload)}, data=payload)

    async def set_network_policy(self, policy: NetworkPolicy) -> None:
        await self._request({"type": "policy", "policy": _policy(policy)})

    async def close(self) -> None:
        """Ask the server to close the session and wait until it has.
        Idempotent. If this is cancelled, the connection is dropped, and the
        server closes the session on its own within its grace."""
        if self._closed:
            return
        self._closed = True
        self._env._closed(self._server)
        conn = self._conn
        if conn.closed:
            return
        try:
            async with self._lock:
                await conn.send({"type": "close"})
                while True:
                    message = await conn.receive()
                    if isinstance(message, dict) and message["type"] == "closed":
                        break
        except (ConnectionLost, p.ProtocolError):
            pass  # the server is gone, and so is the session
        finally:
            await conn.abort()
