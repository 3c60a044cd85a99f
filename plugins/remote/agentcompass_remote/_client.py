"""A WebSocket client connection that needs no background task.

trio-websocket's client runs a reader task in a nursery the caller owns;
a session returned by ``open`` outlives every nursery of its caller, so the
client side speaks WebSocket itself with ``wsproto`` (the protocol engine
trio-websocket is built on): every read happens inside the operation that
waits for it, and the connection is one stream the session owns and closes.
"""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import urlsplit

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)

from ._protocol import MAX_MESSAGE_BYTES, ProtocolError, decode, encode, set_keepalive

__all__ = ["ClientConnection", "ConnectionLost", "parse_url"]

_RECEIVE_BYTES = 1024 * 1024


class ConnectionLost(Exception):
    """The connection to the server closed or failed."""


def parse_url(url: str) -> tuple[str, int, str, bool]:
    """(host, port, resource, tls) of a ``ws://`` or ``wss://`` URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname or parts.port is None:
        raise ValueError(f"not a ws://host:port URL: {url!r}")
    return parts.hostname, parts.port, parts.path or "/", parts.scheme == "wss"


class ClientConnection:
    """One WebSocket connection to a sandbox server. One task reads (its
    owner serializes operations); any number may send, one write at a time."""

    def __init__(self, stream: trio.abc.Stream, max_message_bytes: int = 4 * MAX_MESSAGE_BYTES):
        self._stream = stream
        self._ws = WSConnection(ConnectionType.CLIENT)
        self._max = max_message_bytes
        self._parts: list[Any] = []
        self._size = 0
        self._pending: list[str | bytes] = []
        self._close_reason: str | None = None
        self._sending = trio.Lock()
        self.closed = False

    @classmethod
    async def connect(cls, url: str) -> ClientConnection:
        """Open the TCP (or TLS) stream and complete the opening handshake."""
        host, port, resource, tls = parse_url(url)
        try:
            stream: trio.abc.Stream
            tcp = await trio.open_tcp_stream(host, port)
            set_keepalive(tcp.socket)  # a server that vanished breaks the session's connection
            stream = trio.SSLStream(tcp, ssl.create_default_context(), server_hostname=host) if tls else tcp
        except OSError as exc:
            raise ConnectionLost(f"cannot connect to {url}: {exc.strerror or exc}") from None
        conn = cls(stream)
        try:
            await conn._send_event(Request(host=f"{host}:{port}", target=resource))
            while True:
                for event in await conn._events():
                    if isinstance(event, AcceptConnection):
                        return conn
                    if isinstance(event, RejectConnection | RejectData):
                        raise ConnectionLost(f"{url} refused the WebSocket handshake")
        except BaseException:
            await conn.abort()
            raise

    async def send(self, *messages: dict[str, Any] | bytes) -> None:
        """Send messages in one write (a request and what follows it cost one
        system call and no extra round trip)."""
        await self._send_event(
            *(TextMessage(data=encode(m)) if isinstance(m, dict) else BytesMessage(data=m) for m in messages)
        )

    async def receive(self) -> dict[str, Any] | bytes:
        """The next message: a decoded JSON object, or binary data. Messages
        that arrived before the server closed the connection come first."""
        while not self._pending:
            if self._close_reason is not None:
                raise ConnectionLost(self._close_reason)
            for event in await self._events():
                if isinstance(event, TextMessage | BytesMessage):
                    self._parts.append(event.data)
                    self._size += len(event.data)
                    if self._size > self._max:
                        await self.abort()
                        raise ConnectionLost(f"the server sent a message over {self._max} bytes")
                    if event.message_finished:
                        joined: str | bytes = (
                            "".join(self._parts) if isinstance(event, TextMessage) else b"".join(self._parts)
                        )
                        self._pending.append(joined)
                        self._parts, self._size = [], 0
                elif isinstance(event, Ping):
                    await self._send_event(event.response())
                elif isinstance(event, CloseConnection):
                    await self.abort()
                    reason = f" ({event.code}: {event.reason})" if event.reason else f" ({event.code})"
                    self._close_reason = "the server closed the connection" + reason
                    break
        message = self._pending.pop(0)
        return decode(message) if isinstance(message, str) else message

    async def receive_json(self) -> dict[str, Any]:
        message = await self.receive()
        if not isinstance(message, dict):
            raise ProtocolError("expected a JSON message, got binary data")
        return message

    async def _events(self) -> list[Any]:
        try:
            data = await self._stream.receive_some(_RECEIVE_BYTES)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            await self.abort()
            raise ConnectionLost(f"connection lost: {exc or type(exc).__name__}") from None
        if not data:
            await self.abort()
            raise ConnectionLost("the server closed the connection")
        self._ws.receive_data(bytes(data))
        return list(self._ws.events())

    async def _send_event(self, *events: Any) -> None:
        async with self._sending:
            if self.closed:
                raise ConnectionLost("the connection is closed")
            try:
                await self._stream.send_all(b"".join(self._ws.send(event) for event in events))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                await self.abort()
                raise ConnectionLost(f"connection lost: {exc or type(exc).__name__}") from None

    async def abort(self) -> None:
        """Drop the connection without a closing handshake (the server treats
        it as a client that went away)."""
        if not self.closed:
            self.closed = True
            await trio.aclose_forcefully(self._stream)
