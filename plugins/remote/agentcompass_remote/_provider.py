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
so is a pool where no server could open a session. The session itself is
:class:`~._session.RemoteSession`; its ``expose_directory`` and
``expose_socket`` (an agent's installation, the model gateway) copy small
directories to the server, relay unix sockets over the session's connection,
and take agent cache entries from the server's own cache.
"""

from __future__ import annotations

import secrets
from typing import Any, ClassVar

import attrs
import trio

from agentcompass import (
    BaseEnvironment,
    ComponentError,
    ExecutionPlan,
    IssueError,
    NetworkPolicy,
    Secret,
    build_component,
    register,
)

from . import _protocol as p
from ._client import ClientConnection, ConnectionLost, parse_url
from ._failures import fail, reason, reply_error
from ._pool import PoolServer
from ._session import RemoteSession

__all__ = ["RemoteEnvironment"]

_DEFAULT_MAX_OUTPUT = 1024 * 1024


def _urls(value: Any) -> tuple[str, ...]:
    urls = (value,) if isinstance(value, str) else tuple(value) if isinstance(value, list) else ()
    if not urls or not all(isinstance(u, str) for u in urls):
        raise ComponentError(
            f"environment 'remote': url must be a ws:// URL or a non-empty list of them, got {value!r}"
        )
    for url in urls:
        try:
            parse_url(url)
        except ValueError as exc:
            raise ComponentError(f"environment 'remote': {exc}") from None
    if len(set(urls)) != len(urls):
        raise ComponentError("environment 'remote': url lists a server twice")
    return urls


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
        self._servers = [PoolServer(url) for url in _urls(self.options.url)]
        self._probe_lock = trio.Lock()
        token = self.options.token
        self._token = token.reveal() if isinstance(token, Secret) else ""
        if not self._token:
            where = f" ({token} is empty or unset)" if isinstance(token, Secret) and token.env_var else ""
            raise ComponentError(
                f"environment 'remote' needs a token (config key 'token', e.g. '${{COMPASS_TOKEN}}'){where}"
            )
        self._inner: BaseEnvironment | None = None
        max_output = self.options.provider_config.get("max_output_bytes", _DEFAULT_MAX_OUTPUT)
        self._max_output = max_output if isinstance(max_output, int) and max_output > 0 else _DEFAULT_MAX_OUTPUT

    @property
    def features(self) -> frozenset[str]:  # type: ignore[override]
        """The served provider's, when it is installed here too (else none:
        a plan needing more is refused rather than sent where it may not run)."""
        inner = self._served()
        return frozenset(inner.features) if inner is not None else frozenset()

    def _served(self) -> BaseEnvironment | None:
        if self._inner is None:
            try:
                self._inner = build_component("environment", self.options.provider, dict(self.options.provider_config))
            except ComponentError as exc:
                if "unknown environment id" not in str(exc):
                    raise
        return self._inner

    def build_config(self, plan: ExecutionPlan) -> dict[str, Any]:
        """The open config: the plan's phase policies, which the server's
        provider checks before it opens. When that provider is installed here
        too, its ``build_config`` rejects an unenforceable plan now (preflight)."""
        inner = self._served()
        if inner is not None:
            inner.build_config(plan)
        return {
            "task_id": plan.task_id,
            "sandbox": p.sandbox_message(plan.sandbox),
            "policies": {
                "baseline": p.policy_message(plan.baseline_network_policy),
                "run": p.policy_message(plan.run_network_policy),
                "evaluation": p.policy_message(plan.evaluation_network_policy),
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
            "policy": p.policy_message(policy),
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
        raise fail(f"no server of the pool could open session {name!r}: " + "; ".join(refusals))

    async def _probe(self) -> None:
        """Learn the capacity and load of every server not heard from yet
        (once, by the first open; concurrent opens wait for it), so that the
        first opens too go where the most capacity is free."""
        async with self._probe_lock:
            unknown = [s for s in self._servers if s.capacity is None and s.down_until < 0]

            async def probe(server: PoolServer) -> None:
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

    def _order(self) -> list[PoolServer]:
        """Servers to try, best first: those due to be tried again after a
        failure, then the others by free capacity; servers still skipped last."""
        now = trio.current_time()
        due = [s for s in self._servers if 0 <= s.down_until <= now]
        up = sorted((s for s in self._servers if s.down_until < 0), key=lambda s: -s.free())
        skipped = sorted((s for s in self._servers if s.down_until > now), key=lambda s: s.down_until)
        return due + up + skipped

    async def _open_on(self, server: PoolServer, request: dict[str, Any], refusals: list[str]) -> RemoteSession | None:
        try:
            with trio.fail_after(self.options.connect_timeout_seconds):
                conn, welcome = await self._connect(server.url, request)
        except (ConnectionLost, p.ProtocolError, trio.TooSlowError) as exc:
            server.mark_down(self.options.retry_down_seconds)
            refusals.append(f"{server.url}: {reason(exc)}")
            return None
        try:
            server.capacity, server.load = welcome["capacity"], welcome["load"]
            server.down_until, server.failures = -1.0, 0
            reply = await conn.receive_json()
            kind = reply["type"]
            if kind == "opened":
                session = RemoteSession(
                    server,
                    conn,
                    request["name"],
                    reply,
                    max_output=self._max_output,
                    retry_down_seconds=self.options.retry_down_seconds,
                )
                server.load += 1
                return session
            await conn.abort()
            if kind == "full":
                refusals.append(f"{server.url}: full ({reply.get('load')} of {reply.get('capacity')} sessions)")
                return None
            if kind == "error":
                raise reply_error(reply)
            raise p.ProtocolError(f"unexpected reply {kind!r} to open")
        except (ConnectionLost, p.ProtocolError) as exc:
            await conn.abort()
            server.mark_down(self.options.retry_down_seconds)
            refusals.append(f"{server.url}: {reason(exc)}")
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
            try:
                welcome = await conn.receive_json()
            except ConnectionLost as exc:
                if "(4001" in str(exc):
                    # A server before protocol 5 refuses another version as it refuses a wrong token.
                    raise ConnectionLost(
                        f"{exc}: a wrong token, or a server speaking another protocol than version {p.VERSION}"
                    ) from None
                raise
            if welcome.get("type") != "welcome" or welcome.get("version") != p.VERSION:
                raise p.ProtocolError(
                    f"the server answered {welcome.get('type')!r} (protocol version {welcome.get('version')!r}, "
                    f"this client {p.VERSION})"
                )
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
            raise IssueError("warning", "cleanup_failed", f"sandbox server {url}: {reason(exc)}") from None
        try:
            reply = await conn.receive_json()
        except (ConnectionLost, p.ProtocolError) as exc:
            raise IssueError("warning", "cleanup_failed", f"sandbox server {url}: {reason(exc)}") from None
        finally:
            await conn.abort()
        if reply.get("type") == "error":
            raise reply_error(reply)
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
