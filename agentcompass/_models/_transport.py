"""The HTTP transport of the shared model clients: httpx's, with an O(1) pool.

httpcore's ``AsyncConnectionPool`` (1.0) re-examines every connection on
every request and every response close, polling each idle socket and
counting the connections once per connection: O(connections²) Python work
and O(connections) system calls per request. With the pool as large as the
concurrency that uses it (100 and more), that was most of the client's CPU
(bench scenario ``agent``: 2.5 million ``is_idle`` calls for 5,000
requests). :class:`StackPool` does what a model client needs in O(1):

- at most ``max_connections`` requests hold a connection at once (a FIFO
  ``trio.Semaphore``; waiting longer than the pool timeout is
  ``httpcore.PoolTimeout``);
- a request takes the most recently used idle connection of its origin
  (checking only that one for expiry) or opens a new one;
- when its response is closed, a connection that can be reused goes back on
  the stack; one that cannot (an error, a cancellation mid-exchange, a
  ``Connection: close``) has been closed by httpcore and is forgotten.

HTTP/1.1 only, as every OpenAI-compatible server speaks it. Everything else
is httpx's own ``AsyncHTTPTransport`` (exception mapping, streams); only its
pool object is replaced. Trio only (the runtime's loop).
"""

from __future__ import annotations

import math
import ssl
from collections.abc import AsyncIterator
from typing import Any

import httpcore
import httpx
import trio

__all__ = ["StackPool", "endpoint_client", "pooled_transport"]

_KEEPALIVE_SECONDS = 5.0


class StackPool:
    """An HTTP/1.1 connection pool for httpx's transport (see the module docstring)."""

    def __init__(self, max_connections: int, ssl_context: ssl.SSLContext | None = None):
        self._slots = trio.Semaphore(max_connections)
        self._idle: dict[Any, list[httpcore.AsyncHTTPConnection]] = {}
        self._open: set[httpcore.AsyncHTTPConnection] = set()
        self._ssl_context = ssl_context

    @property
    def connections(self) -> list[httpcore.AsyncHTTPConnection]:
        """Every connection the pool holds (idle or in use)."""
        return list(self._open)

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response:
        timeout = request.extensions.get("timeout", {}).get("pool")
        with trio.move_on_after(math.inf if timeout is None else timeout) as waited:
            await self._slots.acquire()
        if waited.cancelled_caught:
            raise httpcore.PoolTimeout("no connection of the pool became free in time")
        try:
            while True:
                connection = await self._connection_for(request.url.origin)
                try:
                    response = await connection.handle_async_request(request)
                except httpcore.ConnectionNotAvailable:
                    await self._discard(connection)  # it closed between uses: take another
                    continue
                except BaseException:
                    self._put_back(connection, request.url.origin)
                    raise
                break
        except BaseException:
            self._slots.release()
            raise
        return httpcore.Response(
            status=response.status,
            headers=response.headers,
            content=_ReleasingStream(response.stream, self, connection, request.url.origin),
            extensions=response.extensions,
        )

    async def _connection_for(self, origin: Any) -> httpcore.AsyncHTTPConnection:
        stack = self._idle.get(_key(origin))
        while stack:
            connection = stack.pop()
            if connection.is_idle() and not connection.has_expired():
                return connection
            await self._discard(connection)
        connection = httpcore.AsyncHTTPConnection(
            origin=origin, ssl_context=self._ssl_context, keepalive_expiry=_KEEPALIVE_SECONDS, http1=True, http2=False
        )
        self._open.add(connection)
        return connection

    async def _discard(self, connection: httpcore.AsyncHTTPConnection) -> None:
        self._open.discard(connection)
        with trio.move_on_after(1, shield=True):
            await connection.aclose()

    def _put_back(self, connection: httpcore.AsyncHTTPConnection, origin: Any) -> None:
        """A connection whose exchange ended: reusable on the stack, else forgotten
        (httpcore closed it when the exchange could not complete)."""
        if connection.is_idle():
            self._idle.setdefault(_key(origin), []).append(connection)
        elif connection.is_closed():
            self._open.discard(connection)

    def _release(self, connection: httpcore.AsyncHTTPConnection, origin: Any) -> None:
        self._put_back(connection, origin)
        self._slots.release()

    async def aclose(self) -> None:
        """Close every connection (the caller bounds the time it may take)."""
        connections, self._open, self._idle = list(self._open), set(), {}
        for connection in connections:
            await connection.aclose()

    async def __aenter__(self) -> StackPool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class _ReleasingStream:
    """A response body that gives its connection back to the pool when closed."""

    def __init__(self, stream: Any, pool: StackPool, connection: httpcore.AsyncHTTPConnection, origin: Any):
        self._stream = stream
        self._pool = pool
        self._connection = connection
        self._origin = origin
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self._stream:
            yield part

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if hasattr(self._stream, "aclose"):
                await self._stream.aclose()
        finally:
            self._pool._release(self._connection, self._origin)


def _key(origin: httpcore.Origin) -> tuple[bytes, bytes, int]:
    return (origin.scheme, origin.host, origin.port)


def pooled_transport(max_connections: int) -> httpx.AsyncHTTPTransport:
    """httpx's transport with a :class:`StackPool` of ``max_connections``."""
    ssl_context = httpx.create_ssl_context(trust_env=False)
    transport = httpx.AsyncHTTPTransport(verify=ssl_context, trust_env=False)
    transport._pool = StackPool(max_connections, ssl_context)  # type: ignore[assignment]
    return transport


class _NoCookies(httpx.Cookies):
    def extract_cookies(self, response: httpx.Response) -> None:
        return None


_NO_COOKIES = _NoCookies()


class _EndpointClient(httpx.AsyncClient):
    """The shared ``httpx.AsyncClient`` of one endpoint, keeping no cookies.

    Model APIs authenticate by header and set no cookie worth sending back,
    while httpx's cookie extraction (``http.cookiejar`` behind urllib
    adapters) was about a tenth of a call's CPU (bench scenario ``agent``).
    """

    @property  # type: ignore[override]
    def cookies(self) -> httpx.Cookies:
        return _NO_COOKIES

    @cookies.setter
    def cookies(self, value: Any) -> None:
        pass


def endpoint_client(key: str, timeout: float, size: int) -> httpx.AsyncClient:
    """The shared client of one endpoint: its key's header, a pool of ``size`` connections."""
    return _EndpointClient(
        # The endpoint's key is part of its identity: the header belongs to its client.
        headers={"Authorization": f"Bearer {key}"} if key else None,
        timeout=httpx.Timeout(timeout),
        transport=pooled_transport(size),
        # No proxy from the environment: an endpoint is reached as configured.
        trust_env=False,
    )
