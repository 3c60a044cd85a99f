"""Serving an ASGI app on a loopback port with hypercorn's Trio worker.

The one way the package's HTTP servers (the viewer, the scripted model
server) listen: no hand-written HTTP layer. The server lives in the caller's
scope: cancelling it stops the server at once; setting ``stop`` stops it
gracefully (no new connections, replies in progress get ``grace_seconds``,
idle keep-alive connections are closed). Either way the listening socket is
closed when :func:`serve_asgi` returns.

:func:`read_body` is the one way those apps read a request's body: into one
buffer, counted as it arrives, refused past the caller's limit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import hypercorn.trio
import trio
from hypercorn.config import Config

__all__ = ["BodyRefused", "lifespan", "listen", "read_body", "serve_asgi"]

ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


def listen(port: int = 0, host: str = "127.0.0.1") -> socket.socket:
    """A listening TCP socket on ``host:port`` (0: a free port) for
    :func:`serve_asgi`; ``OSError`` if it cannot be bound.

    Bound here, not by hypercorn, so a busy port is one ``OSError`` raised
    before any nursery (not a group from hypercorn's), and port 0's choice is
    known before the server starts."""
    return socket.create_server((host, port))


async def serve_asgi(
    app: ASGIApp,
    listener: socket.socket,
    *,
    keep_alive_seconds: float = 5,
    grace_seconds: float = 1,
    stop: trio.Event | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``listener`` (from :func:`listen`; closed on the way
    out) until cancelled or ``stop`` is set."""
    try:
        config = Config()
        config.bind = [f"fd://{os.dup(listener.fileno())}"]
        config.keep_alive_timeout = keep_alive_seconds
        config.graceful_timeout = grace_seconds
        config.include_server_header = False
        config.accesslog = None
        # A logger without handlers: hypercorn's "Running on" lines stay out of
        # the callers' output and its errors reach logging's last resort.
        config.errorlog = logging.getLogger(__name__)
        await hypercorn.trio.serve(
            app,  # type: ignore[arg-type]
            config,
            shutdown_trigger=stop.wait if stop is not None else None,
            task_status=_Started(task_status),
        )
    finally:
        # hypercorn holds a duplicate descriptor and never closes it; shutting
        # the shared socket down stops that copy listening too.
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()


class _Started:
    """Passes on hypercorn's start (its list of URLs is the caller's already)."""

    def __init__(self, task_status: trio.TaskStatus[None]) -> None:
        self._task_status = task_status

    def started(self, value: object = None) -> None:
        self._task_status.started()


async def lifespan(receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]) -> None:
    """Answer ASGI's lifespan protocol for an app with nothing to start or stop."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


class BodyRefused(Exception):
    """The request's body is over the limit (``left``: the client left while sending it)."""

    def __init__(self, message: str, *, left: bool = False):
        super().__init__(message)
        self.left = left


async def read_body(receive: Callable[[], Awaitable[Any]], limit: int) -> bytearray:
    """The request's body in one buffer (the only copy held); raises
    :class:`BodyRefused` as soon as it passes ``limit`` bytes (a declared
    ``Content-Length`` is not trusted: the bytes are counted), or when the
    client leaves before its last byte (``left``)."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise BodyRefused("the client left", left=True)
        chunk = message.get("body", b"")
        if len(body) + len(chunk) > limit:
            raise BodyRefused(f"request body over {limit} bytes")
        body += chunk
        if not message.get("more_body"):
            return body
