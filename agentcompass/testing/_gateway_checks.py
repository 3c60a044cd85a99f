"""The conformance kit's model gateway checks (SPEC 10 "Model gateway", SPEC 12 "Gateway bounds").

A harness that runs an agent inside a session reaches the model only
through :func:`agentcompass.gateway.open_gateway` served into that session,
so what every such harness relies on is checked per provider, through a
real session, a real gateway and a loopback upstream, from a ``python3``
client inside the session (the gateway's forwarder needs one anyway):

- ``gateway_key_masked``: an upstream that echoes its request's headers
  (``Authorization: Bearer <key>``) in 200 and 500 replies, streamed and not,
  never hands the key to the session, nor to the gateway's record;
- ``gateway_memory_bounded``: calls near the body limit and calls far over it
  leave the runtime's Python heap grown by a few bodies at most
  (``tracemalloc``'s peak), however many are made.
"""

from __future__ import annotations

import secrets
import shlex
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, NoReturn

import trio

from agentcompass.runtime import EnvironmentSession, ModelSpec, Secret

__all__ = ["GatewayChecks"]

_FORWARDER_MISSING = 97
_ECHO_CLIENT = r"""
import json, os, sys, urllib.error, urllib.request
url = os.environ["AGENTCOMPASS_GATEWAY_URL"] + "/chat/completions"
auth = {"Authorization": "Bearer " + os.environ["AGENTCOMPASS_GATEWAY_TOKEN"], "Content-Type": "application/json"}
for stream in (False, True, False, True):
    body = json.dumps({"model": "conformance", "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
    try:
        data = urllib.request.urlopen(urllib.request.Request(url, body.encode(), auth), timeout=120).read()
    except urllib.error.HTTPError as exc:
        data = exc.read()
    sys.stdout.write(data.decode("utf-8", "replace") + "\n")
"""
_LOAD_CLIENT = r"""
import os, sys, urllib.error, urllib.request
url = os.environ["AGENTCOMPASS_GATEWAY_URL"] + "/chat/completions"
auth = {"Authorization": "Bearer " + os.environ["AGENTCOMPASS_GATEWAY_TOKEN"], "Content-Type": "application/json"}
statuses = []
for size in [int(a) for a in sys.argv[1:]]:
    body = b'{"model": "conformance", "messages": [{"role": "user", "content": "' + b"x" * size + b'"}]}'
    try:
        statuses.append(urllib.request.urlopen(urllib.request.Request(url, body, auth), timeout=300).status)
    except urllib.error.HTTPError as exc:
        statuses.append(exc.code)
    except OSError:
        statuses.append(0)  # a refused upload may be cut short
print(" ".join(map(str, statuses)))
"""


class _Unsupported(Exception):
    """The provider's sessions cannot serve the gateway: no harness uses it there."""


def _exposes(session: EnvironmentSession) -> bool:
    """Whether the session overrides what ``expose_socket`` rests on (the base raises)."""
    kind = type(session)
    return (
        kind.expose_socket is not EnvironmentSession.expose_socket
        or kind.expose_directory is not EnvironmentSession.expose_directory
    )


class GatewayChecks:
    """The gateway checks of :class:`~agentcompass.testing.EnvironmentConformance` (a mixin)."""

    timeout_seconds: float
    gateway: bool | None

    def _fail(self, message: str, cause: BaseException | None = None) -> NoReturn:
        raise NotImplementedError

    def _opened(self) -> Any:
        raise NotImplementedError

    @asynccontextmanager
    async def _gateway(self, upstream: Any) -> AsyncIterator[tuple[EnvironmentSession, Any, str]]:
        """A session with a gateway to ``upstream`` (an ASGI app or a ModelServer) served into it."""
        from agentcompass._asgi import listen, serve_asgi
        from agentcompass.gateway import open_gateway
        from agentcompass.models import open_model_clients

        key = f"sk-conformance-{secrets.token_hex(12)}"
        async with trio.open_nursery() as nursery, open_model_clients(4):
            if callable(getattr(upstream, "serve", None)):
                url = await nursery.start(upstream.serve)
            else:
                listener = listen()
                await nursery.start(partial(serve_asgi, upstream, listener))
                url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
            model = ModelSpec(name="conformance", api="openai-chat", base_url=url, api_key=Secret(key))
            async with self._opened() as box:
                if not _exposes(box.session):
                    if self.gateway:
                        self._fail("its sessions cannot expose a socket: no harness can serve them the gateway")
                    raise _Unsupported
                async with open_gateway(box.session, model) as gateway:
                    yield box.session, gateway, key
            nursery.cancel_scope.cancel()

    async def _client(self, session: EnvironmentSession, gateway: Any, script: str, args: str = "") -> Any:
        command = gateway.command(f"python3 -c {shlex.quote(script)} {args}")
        result = await session.exec(command, timeout=self.timeout_seconds)
        if result.exit_code == _FORWARDER_MISSING:
            self._fail("the gateway's forwarder needs python3 in the session; pass gateway=False if it has none")
        if result.exit_code != 0:
            self._fail(f"the in-session client exited {result.exit_code}: {result.stderr[-500:]!r}")
        return result

    async def check_gateway_key_masked(self) -> None:
        """An upstream echoing the real key, 200 and 500, streamed and not: the session never gets it."""
        from .model_server import ModelServer, echo_headers

        server = ModelServer([echo_headers(200), echo_headers(200), echo_headers(500), echo_headers(500)])
        unsupported = False
        try:
            async with self._gateway(server) as (session, gateway, key):
                result = await self._client(session, gateway, _ECHO_CLIENT)
                record = gateway.record
        except* _Unsupported:
            unsupported = True
        if unsupported:
            return
        if len(server.requests) != 4 or any(r.headers.get("authorization") != f"Bearer {key}" for r in server.requests):
            self._fail(f"the upstream did not get the 4 calls with the key ({len(server.requests)} calls)")
        if "authorization" not in result.stdout.lower():
            self._fail(f"the session did not get the echoed headers: {result.stdout[:300]!r}")
        for where, text in (("the session's output", result.stdout + result.stderr), ("the record", repr(record))):
            if key in text or key[3:] in text:
                self._fail(f"the real key reached {where} through an echoing upstream")

    async def check_gateway_memory_bounded(self) -> None:
        """Calls near the body limit and far over it grow the runtime's heap by a few bodies at most."""
        from agentcompass import GatewaySpec

        from ._gateway_load import _sink

        limit = GatewaySpec().max_body_bytes
        sizes = [limit - 4096] * 8 + [4 * limit] * 4
        tracing = tracemalloc.is_tracing()
        if not tracing:
            tracemalloc.start()
        unsupported = False
        try:
            async with self._gateway(_sink) as (session, gateway, _):
                base = tracemalloc.get_traced_memory()[0]
                tracemalloc.reset_peak()
                result = await self._client(session, gateway, _LOAD_CLIENT, " ".join(map(str, sizes)))
                peak = tracemalloc.get_traced_memory()[1]
        except* _Unsupported:
            unsupported = True
        finally:
            if not tracing:
                tracemalloc.stop()
        if unsupported:
            return
        statuses = result.stdout.split()
        if statuses[:8] != ["200"] * 8 or any(s not in ("413", "0") for s in statuses[8:]):
            self._fail(f"calls near the limit should pass and calls over it get 413, got {statuses}")
        grown = peak - base
        if grown > 4 * limit:
            self._fail(f"12 calls (8 of {limit} bytes, 4 over the limit) grew the runtime's heap by {grown} bytes")
