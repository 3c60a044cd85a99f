"""Loopback servers of the HTTP tests: a small ASGI app served by hypercorn's
Trio worker, and raw Trio socket servers for what an HTTP server would not do
(drop a connection without saying so, act as a proxy)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

MESSAGES = [{"role": "user", "content": "hi"}]


def completion(content: str = "ok") -> bytes:
    return json.dumps(
        {
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1},
        }
    ).encode()


@attrs.frozen
class Seen:
    """A request as the app received it (header names lower-case)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@attrs.frozen
class Answer:
    status: int = 200
    body: bytes | list[bytes] = attrs.Factory(completion)
    headers: dict[str, str] = attrs.Factory(lambda: {"content-type": "application/json"})


Handler = Callable[[Seen], Awaitable[Answer]]


async def _ok(_: Seen) -> Answer:
    return Answer()


class App:
    """An ASGI app answering every HTTP request with ``handler(request)``
    (a list body is sent as that many body messages: a stream); it records
    the requests, and :meth:`wait_until` waits for a condition on them."""

    def __init__(self, handler: Handler = _ok):
        self.handler = handler
        self.requests: list[Seen] = []
        self._changed = trio.Event()

    def changed(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_until(self, predicate: Callable[[App], bool]) -> None:
        while not predicate(self):
            await self._changed.wait()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        headers["x-peer"] = "{}:{}".format(*scope["client"])  # the connection it came on
        seen = Seen(scope["method"], scope["path"], headers, body)
        self.requests.append(seen)
        self.changed()
        answer = await self.handler(seen)
        await send(
            {
                "type": "http.response.start",
                "status": answer.status,
                "headers": [(k.encode(), v.encode()) for k, v in answer.headers.items()],
            }
        )
        for piece in answer.body if isinstance(answer.body, list) else [answer.body]:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


@asynccontextmanager
async def serving(app: App, certfile: Path | None = None, keyfile: Path | None = None) -> AsyncIterator[str]:
    """``app`` on 127.0.0.1 (TLS with ``certfile``/``keyfile``); its origin, e.g. ``http://127.0.0.1:PORT``."""
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    if certfile is not None:
        config.certfile, config.keyfile = str(certfile), str(keyfile)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(serve, app, config)
        try:
            yield binds[0]
        finally:
            nursery.cancel_scope.cancel()


async def read_head(stream: trio.abc.Stream, buffer: bytearray) -> bytes | None:
    """The next request head of ``stream`` (``buffer`` keeps what follows it); None at EOF."""
    while b"\r\n\r\n" not in buffer:
        data = await stream.receive_some(65536)
        if not data:
            return None
        buffer += data
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    buffer[:] = rest
    return head


async def read_request(stream: trio.abc.Stream, buffer: bytearray) -> bytes | None:
    """The next whole request's head (its body read and dropped); None at EOF."""
    head = await read_head(stream, buffer)
    if head is None:
        return None
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(buffer) < length:
        data = await stream.receive_some(65536)
        if not data:
            return None
        buffer += data
    del buffer[:length]
    return head


def response(body: bytes) -> bytes:
    """A 200 with ``body``, keep-alive (no ``Connection: close``)."""
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


class RawServer:
    """A Trio socket server; ``handler(stream, server)`` serves one connection.
    Counts connections and requests (the handler counts its requests)."""

    def __init__(self, handler: Callable[[trio.SocketStream, RawServer], Awaitable[None]]):
        self.handler = handler
        self.connections = 0
        self.requests = 0
        self.heads: list[bytes] = []

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        task_status.started(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(self._connection, listeners)

    async def _connection(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        try:
            await self.handler(stream, self)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await trio.aclose_forcefully(stream)


@asynccontextmanager
async def raw_serving(handler: Callable[[trio.SocketStream, RawServer], Awaitable[None]]) -> AsyncIterator[Any]:
    """(server, port) of a running :class:`RawServer`."""
    server = RawServer(handler)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve)
        try:
            yield server, port
        finally:
            nursery.cancel_scope.cancel()


def make_ca_and_server_cert(directory: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key): a test CA and a
    certificate it signed for 127.0.0.1, made with the ``openssl`` command."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a test CA")
    ca_key, ca, key, csr, cert = (directory / n for n in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem"))
    ext = directory / "server.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=agentcompass test CA",
            "-keyout", str(ca_key), "-out", str(ca))  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(csr))
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
            "-days", "1", "-extfile", str(ext), "-out", str(cert))  # fmt: skip
    return ca, cert, key
