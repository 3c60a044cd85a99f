"""The ``httpx.AsyncClient`` of one model endpoint, on httpx's own transport.

Everything HTTP is httpx's: ``httpx.AsyncHTTPTransport`` (httpcore's
connection pool, TLS, HTTP/1.1), proxies from ``HTTP_PROXY`` /
``HTTPS_PROXY`` / ``ALL_PROXY`` / ``NO_PROXY`` and the trust store from
``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` (else certifi's bundle), both as httpx
reads them, and a cookie jar of the endpoint's own. Added on top, both for
long-lived pools against real servers:

- TCP keepalive on every connection: a reply that takes minutes to generate
  sends no byte meanwhile, and a NAT or load balancer drops connections it
  thinks idle; the probes keep it open and find a dead peer.
- One retry of a request that failed on a *reused* keep-alive connection
  before the reply's head arrived: the server closed the connection while
  the request was on its way, so nothing was read and the request goes again
  on a new connection. A new connection that fails is never retried (that
  is the server's answer), nor is anything that failed after the head.

- The pool of ``max_connections`` is httpx transports of at most
  :data:`SHARD_CONNECTIONS` connections each, a request going to the one
  with the fewest requests in flight. httpcore's pool does work quadratic in
  its connections on every request (encode/httpcore#1035, open): at 100
  connections that was more CPU per call than everything else the runtime
  does for it (bench scenario ``agent``). Small pools keep it constant; one
  pool of one shard is httpx's exactly.

Idle connections are kept :data:`KEEPALIVE_EXPIRY_SECONDS`, under the 5 s
after which uvicorn (vLLM, SGLang) closes them, so that race is rare before
the retry is needed. Connecting takes at most :data:`CONNECT_TIMEOUT_SECONDS`
(a host that does not answer is FATAL ``model_unreachable`` in seconds, not
after ``timeout_seconds``).
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import httpx

__all__ = [
    "ANTHROPIC_VERSION",
    "CONNECT_TIMEOUT_SECONDS",
    "KEEPALIVE_EXPIRY_SECONDS",
    "SHARD_CONNECTIONS",
    "auth_headers",
    "endpoint_client",
    "environment_proxies",
]

CONNECT_TIMEOUT_SECONDS = 10.0
KEEPALIVE_EXPIRY_SECONDS = 4.0
SHARD_CONNECTIONS = 8

#: Probe after 60 s of silence, every 10 s, give up after 6 unanswered.
_KEEPALIVE = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)] + [
    (socket.IPPROTO_TCP, getattr(socket, name), value)
    for name, value in (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 6))
    if hasattr(socket, name)
]

#: The errors of a connection the server had closed: httpcore reports a
#: failed send as the read that follows it.
_STALE = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


class _Progress:
    """A request's httpcore ``trace`` callback: did it open a connection,
    and was the reply's head read (see ``_StaleRetry``)."""

    __slots__ = ("connected", "head_read", "outer")

    def __init__(self, outer: Any):
        self.connected = False
        self.head_read = False
        self.outer = outer

    async def __call__(self, event: str, info: dict[str, Any]) -> None:
        if event == "connection.connect_tcp.started":
            self.connected = True
        elif event == "http11.receive_response_headers.complete":
            self.head_read = True
        if self.outer is not None:
            await self.outer(event, info)


class _StaleRetry(httpx.AsyncBaseTransport):
    """``inner``, sending a request once more when it failed on a reused
    connection before the reply's head was read (see the module docstring)."""

    def __init__(self, inner: httpx.AsyncBaseTransport):
        self._inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        original = request.extensions
        progress = _Progress(original.get("trace"))
        request.extensions = {**original, "trace": progress}
        try:
            return await self._inner.handle_async_request(request)
        except _STALE:
            if progress.connected or progress.head_read:
                raise
        request.extensions = original
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Shards(httpx.AsyncBaseTransport):
    """Transports taking one pool's requests between them, each request to the
    one with the fewest in flight (a request is in flight until its response
    is closed): a request waits for a connection only when all are busy."""

    def __init__(self, shards: list[httpx.AsyncBaseTransport]):
        self._shards = shards
        self._busy = [0] * len(shards)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        busy = self._busy
        index = busy.index(min(busy))
        busy[index] += 1
        try:
            response = await self._shards[index].handle_async_request(request)
        except BaseException:
            busy[index] -= 1
            raise
        assert isinstance(response.stream, httpx.AsyncByteStream)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_Release(response.stream, busy, index),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        for shard in self._shards:
            await shard.aclose()


class _Release(httpx.AsyncByteStream):
    """A response body that counts its request out of its shard once closed."""

    def __init__(self, stream: httpx.AsyncByteStream, busy: list[int], index: int):
        self._stream = stream
        self._busy = busy
        self._index: int | None = index

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        if self._index is not None:
            self._busy[self._index] -= 1
            self._index = None
        await self._stream.aclose()


def _transport(size: int, verify: ssl.SSLContext, proxy: str | None = None) -> httpx.AsyncBaseTransport:
    def pool(connections: int) -> httpx.AsyncHTTPTransport:
        limits = httpx.Limits(
            max_connections=connections,
            max_keepalive_connections=connections,
            keepalive_expiry=KEEPALIVE_EXPIRY_SECONDS,
        )
        return httpx.AsyncHTTPTransport(verify=verify, limits=limits, socket_options=_KEEPALIVE, proxy=proxy)

    count = -(-size // SHARD_CONNECTIONS)
    sizes = [size // count + (1 if i < size % count else 0) for i in range(count)]
    inner = pool(size) if count == 1 else _Shards([pool(n) for n in sizes])
    return _StaleRetry(inner)


#: The Messages API version every request names (Anthropic requires the header).
ANTHROPIC_VERSION = "2023-06-01"


def auth_headers(api: str, key: str) -> dict[str, str]:
    """The headers that carry ``key`` for ``api``: ``x-api-key`` (with
    ``anthropic-version``) for ``anthropic-messages``, ``x-goog-api-key``
    for ``google-generate-content``, else ``Authorization:
    Bearer``; none for an empty key (a local server)."""
    if api == "anthropic-messages":
        return {"x-api-key": key, "anthropic-version": ANTHROPIC_VERSION} if key else {"anthropic-version": ANTHROPIC_VERSION}
    if api == "google-generate-content":
        return {"x-goog-api-key": key} if key else {}
    return {"Authorization": f"Bearer {key}"} if key else {}


def trust_store() -> ssl.SSLContext:
    """The verifying context of every endpoint (``SSL_CERT_FILE``, ``SSL_CERT_DIR``
    or certifi's, as httpx picks it); loading one costs tens of milliseconds,
    so a pool makes it once."""
    return httpx.create_ssl_context(trust_env=True)


def environment_proxies() -> dict[str, str | None]:
    """The proxy table httpx builds from the environment for a client with no
    transport of its own (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``, and
    ``NO_PROXY`` as curl reads it), mount pattern -> proxy URL, ``None``
    going direct. A client given its own transport (ours, for the socket
    options) skips httpx's, and httpx keeps its builder private, so the same
    rules are applied here."""
    found = urllib.request.getproxies()
    mounts: dict[str, str | None] = {}
    for scheme in ("http", "https", "all"):
        if found.get(scheme):
            host = found[scheme]
            mounts[f"{scheme}://"] = host if "://" in host else f"http://{host}"
    for host in (name.strip() for name in found.get("no", "").split(",")):
        if host == "*":
            return {}  # NO_PROXY=* turns every proxy off
        if not host:
            continue
        if "://" in host:
            mounts[host] = None
        elif _is_ip(host, 4):
            mounts[f"all://{host}"] = None
        elif _is_ip(host, 6):
            mounts[f"all://[{host}]"] = None
        elif host.lower() == "localhost":
            mounts[f"all://{host}"] = None
        else:
            # ``example.com`` exempts it and its subdomains, ``.example.com`` only the subdomains.
            mounts[f"all://*{host}"] = None
    return mounts


def _is_ip(host: str, version: int) -> bool:
    try:
        return ipaddress.ip_address(host.split("/")[0]).version == version
    except ValueError:
        return False


def endpoint_client(
    key: str,
    timeout: float,
    size: int,
    verify: ssl.SSLContext | None,
    transport: httpx.AsyncBaseTransport | None = None,
    *,
    api: str = "openai-chat",
) -> httpx.AsyncClient:
    """The shared client of one endpoint: its key's header as ``api`` sends it
    (:func:`auth_headers`), ``timeout`` for
    each read, write and wait for a connection (connecting within
    :data:`CONNECT_TIMEOUT_SECONDS` of it), a pool of ``size`` connections
    per origin; ``transport``, when given, carries every request instead
    (a test seam: no proxies, no retry)."""
    mounts: dict[str, httpx.AsyncBaseTransport | None] | None = None
    if transport is None:
        assert verify is not None
        transport = _transport(size, verify)
        mounts = {
            pattern: None if proxy is None else _transport(size, verify, proxy)
            for pattern, proxy in environment_proxies().items()
        }
    return httpx.AsyncClient(
        # The endpoint's key is part of its identity: the header belongs to its client.
        headers=auth_headers(api, key) or None,
        timeout=httpx.Timeout(timeout, connect=min(CONNECT_TIMEOUT_SECONDS, timeout)),
        transport=transport,
        mounts=mounts,
    )
