"""The HTTP transport of the shared model clients: HTTP/1.1 on ``h11`` and Trio streams.

A model client's requests are all alike (a JSON POST, a JSON reply, on
keep-alive connections to one origin), and the client's own CPU per call
decides how many calls per second one runtime process sustains (bench
scenario ``agent``). httpx's default transport goes through httpcore's
generic layers (its pool, per-operation exception-mapping context managers,
trace hooks, an I/O backend wrapper) that cost more than the HTTP itself;
:class:`H11Transport` is that exchange and nothing else, under the same
``httpx.AsyncClient``:

- at most ``max_connections`` requests hold a connection at once (a FIFO
  ``trio.Semaphore``; waiting longer than the pool timeout is
  ``httpx.PoolTimeout``);
- a request takes the most recently used idle connection of its origin, or
  opens one (TLS for ``https``); an idle connection is reused only while it
  is younger than the keep-alive expiry and has nothing to read (a server
  that closed it made it readable);
- when its response is closed, a connection whose exchange completed goes
  back on its origin's stack; any other (an error, a cancellation
  mid-exchange, a ``Connection: close``) is closed at once, so a cancelled
  call never leaves a half-read connection behind;
- timeouts are httpx's: ``connect`` bounds opening a connection, ``write``
  sending the request, ``read`` each wait for the next bytes of the reply.

Failures are httpx's exceptions (``ConnectError``, ``ReadTimeout``, ...), so
callers classify them as they would with httpx's own transport. Non-goals:
HTTP/2, proxies, client certificates. Trio only (the runtime's loop).
"""

from __future__ import annotations

import math
import select
import ssl
from collections.abc import AsyncIterator
from typing import Any

import h11
import httpx
import trio

__all__ = ["H11Transport", "endpoint_client"]

_KEEPALIVE_SECONDS = 5.0
_poll = getattr(select, "poll", None)
_READ_SIZE = 65536


class _Connection:
    """One HTTP/1.1 connection: its stream, its ``h11`` state and its socket."""

    __slots__ = ("fileno", "h11", "idle_since", "key", "reusable_after", "stream")

    def __init__(self, stream: trio.abc.Stream, fileno: int, key: tuple[bytes, bytes, int]):
        self.stream = stream
        self.fileno = fileno
        self.key = key
        self.h11 = h11.Connection(h11.CLIENT)
        self.idle_since = 0.0
        #: False once sending failed: whatever the reply, the stream is not reused.
        self.reusable_after = True

    def reusable(self, now: float, keepalive: float) -> bool:
        """Young enough, and nothing to read: an idle connection the server closed is readable."""
        if now - self.idle_since >= keepalive:
            return False
        try:
            if _poll is not None:  # any descriptor number, where select() stops at 1024
                poller = _poll()
                poller.register(self.fileno, select.POLLIN)
                return not poller.poll(0)
            readable, _, _ = select.select([self.fileno], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable


class H11Transport(httpx.AsyncBaseTransport):
    """An HTTP/1.1 connection pool of ``max_connections`` for ``httpx.AsyncClient``
    (see the module docstring).

    ``ssl_context`` verifies ``https`` servers; by default httpx's (the
    system's trust store, or certifi's), made at the first ``https``
    connection: loading it costs more than a hundred loopback calls.
    ``keepalive_seconds`` is how long an idle connection may be reused.
    """

    def __init__(
        self,
        max_connections: int,
        ssl_context: ssl.SSLContext | None = None,
        keepalive_seconds: float = _KEEPALIVE_SECONDS,
    ):
        self._slots = trio.Semaphore(max_connections)
        self._idle: dict[tuple[bytes, bytes, int], list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._ssl_context = ssl_context
        self._keepalive = keepalive_seconds
        self._closed = False

    @property
    def connections(self) -> int:
        """How many connections are open (idle or in use)."""
        return len(self._open)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._closed:
            raise RuntimeError("the transport is closed")
        timeouts = request.extensions.get("timeout", {})
        await _acquire(self._slots, timeouts.get("pool"), request)
        try:
            connection = await self._connection_for(request, timeouts.get("connect"))
            try:
                response = await _exchange(connection, request, timeouts.get("write"), timeouts.get("read"))
            except BaseException:
                await self._close(connection)
                raise
        except BaseException:
            self._slots.release()
            raise
        status, headers, reason = response
        return httpx.Response(
            status,
            headers=headers,
            stream=_Body(self, connection, timeouts.get("read"), request),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": reason},
        )

    async def _connection_for(self, request: httpx.Request, timeout: float | None) -> _Connection:
        url = request.url
        key = (url.raw_scheme, url.raw_host, url.port or (443 if url.raw_scheme == b"https" else 80))
        stack = self._idle.get(key)
        if stack:
            now = trio.current_time()
            while stack:
                connection = stack.pop()
                if connection.reusable(now, self._keepalive):
                    return connection
                await self._close(connection)
        return await self._connect(key, url.host, timeout, request)

    async def _connect(
        self, key: tuple[bytes, bytes, int], host: str, timeout: float | None, request: httpx.Request
    ) -> _Connection:
        with trio.move_on_after(_seconds(timeout)) as scope:
            try:
                socket_stream = await trio.open_tcp_stream(host, key[2])
            except OSError as exc:
                raise httpx.ConnectError(str(exc) or type(exc).__name__, request=request) from None
            stream: trio.abc.Stream = socket_stream
            if key[0] == b"https":
                if self._ssl_context is None:
                    self._ssl_context = httpx.create_ssl_context(trust_env=False)
                context = self._ssl_context
                stream = trio.SSLStream(socket_stream, context, server_hostname=host, https_compatible=True)
                try:
                    await stream.do_handshake()
                except BaseException as exc:
                    await trio.aclose_forcefully(stream)
                    if isinstance(exc, (trio.BrokenResourceError, ssl.SSLError, OSError)):
                        raise httpx.ConnectError(f"TLS handshake failed: {exc}", request=request) from None
                    raise
        if scope.cancelled_caught:
            raise httpx.ConnectTimeout("timed out connecting", request=request)
        connection = _Connection(stream, socket_stream.socket.fileno(), key)
        self._open.add(connection)
        return connection

    def _put_back(self, connection: _Connection) -> bool:
        """Keep a connection whose exchange completed for the next request of its origin."""
        state = connection.h11
        if not connection.reusable_after or self._closed:
            return False
        if state.our_state is not h11.DONE or state.their_state is not h11.DONE:
            return False
        state.start_next_cycle()
        connection.idle_since = trio.current_time()
        self._idle.setdefault(connection.key, []).append(connection)
        return True

    async def _close(self, connection: _Connection) -> None:
        self._open.discard(connection)
        await trio.aclose_forcefully(connection.stream)

    async def _release(self, connection: _Connection) -> None:
        try:
            if not self._put_back(connection):
                await self._close(connection)
        finally:
            self._slots.release()

    async def aclose(self) -> None:
        """Close every connection (the caller bounds the time it may take)."""
        self._closed = True
        connections, self._open, self._idle = list(self._open), set(), {}
        for connection in connections:
            await trio.aclose_forcefully(connection.stream)


class _Body(httpx.AsyncByteStream):
    """A reply's body, read from its connection; closing it gives the connection
    back to the pool (a completed exchange) or closes it."""

    def __init__(self, pool: H11Transport, connection: _Connection, timeout: float | None, request: httpx.Request):
        self._pool = pool
        self._connection = connection
        self._timeout = timeout
        self._request = request
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            event = await _next_event(self._connection, self._timeout, self._request)
            if type(event) is h11.Data:
                yield bytes(event.data)
            elif type(event) is h11.EndOfMessage:
                return
            else:
                raise httpx.RemoteProtocolError("the reply ended before its body", request=self._request)

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._pool._release(self._connection)


async def _acquire(slots: trio.Semaphore, timeout: float | None, request: httpx.Request) -> None:
    try:
        slots.acquire_nowait()
    except trio.WouldBlock:
        with trio.move_on_after(_seconds(timeout)) as scope:
            await slots.acquire()
        if scope.cancelled_caught:
            raise httpx.PoolTimeout("no connection of the pool became free in time", request=request) from None
    else:
        await trio.lowlevel.checkpoint()


async def _exchange(
    connection: _Connection, request: httpx.Request, write_timeout: float | None, read_timeout: float | None
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Send ``request`` and read the reply's head: (status, headers, reason)."""
    state = connection.h11
    body = await request.aread()
    try:
        data = state.send(h11.Request(method=request.method, target=request.url.raw_path, headers=request.headers.raw))
        if body:
            data += state.send(h11.Data(data=body))
        data += state.send(h11.EndOfMessage())
    except h11.LocalProtocolError as exc:
        raise httpx.LocalProtocolError(str(exc), request=request) from None
    write_error: httpx.WriteError | None = None
    with trio.move_on_after(_seconds(write_timeout)) as scope:
        try:
            await connection.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            # A server may answer (413, 400) and close before reading the whole
            # request: its reply, if it sent one, is the better outcome.
            write_error = httpx.WriteError(str(exc) or type(exc).__name__, request=request)
            connection.reusable_after = False
    if scope.cancelled_caught:
        raise httpx.WriteTimeout("timed out sending the request", request=request)
    while True:
        try:
            event = await _next_event(connection, read_timeout, request)
        except httpx.TransportError:
            if write_error is not None:
                raise write_error from None
            raise
        if type(event) is h11.Response:
            return event.status_code, event.headers.raw_items(), event.reason
        if type(event) is not h11.InformationalResponse:  # a 1xx: the real reply follows
            raise httpx.RemoteProtocolError("the server closed the connection without replying", request=request)


async def _next_event(connection: _Connection, timeout: float | None, request: httpx.Request) -> Any:
    state = connection.h11
    while True:
        try:
            event = state.next_event()
        except h11.RemoteProtocolError as exc:
            raise httpx.RemoteProtocolError(str(exc), request=request) from None
        if event is not h11.NEED_DATA:
            return event
        with trio.move_on_after(_seconds(timeout)) as scope:
            try:
                data = await connection.stream.receive_some(_READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise httpx.ReadError(str(exc) or type(exc).__name__, request=request) from None
        if scope.cancelled_caught:
            raise httpx.ReadTimeout("timed out waiting for the reply", request=request)
        if not data and state.their_state is h11.SEND_RESPONSE:
            raise httpx.RemoteProtocolError("the server closed the connection without replying", request=request)
        state.receive_data(bytes(data))  # the same object for bytes


def _seconds(timeout: float | None) -> float:
    return math.inf if timeout is None else timeout


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


def endpoint_client(
    key: str, timeout: float, size: int, transport: httpx.AsyncBaseTransport | None = None
) -> httpx.AsyncClient:
    """The shared client of one endpoint: its key's header, a pool of ``size``
    connections (or ``transport``, when given)."""
    return _EndpointClient(
        # The endpoint's key is part of its identity: the header belongs to its client.
        headers={"Authorization": f"Bearer {key}"} if key else None,
        timeout=httpx.Timeout(timeout),
        transport=H11Transport(size) if transport is None else transport,
        # No proxy from the environment: an endpoint is reached as configured.
        trust_env=False,
    )
