"""A small read-only HTTP/1.1 server for the viewer, on Trio streams and h11.

It answers ``GET`` and ``HEAD`` of the :class:`~._site.Site`'s paths and
nothing else, listens on loopback only, and refuses a ``Host`` other than
the loopback address it serves (so a web page that rebinds a DNS name to
127.0.0.1 cannot read results). Reads of run directories run in worker
threads, two at a time, beside one background thread that reads every run's
task rows from the start, so the event loop never waits on a parse.
"""

from __future__ import annotations

from functools import partial
from urllib.parse import unquote, urlsplit

import h11
import trio

from ._site import Site

__all__ = ["serve"]

_MAX_REQUEST = 16 * 1024
_IDLE_SECONDS = 60  # a keep-alive connection nobody uses is closed
_SECURITY_HEADERS = [
    (b"X-Content-Type-Options", b"nosniff"),
    (b"Referrer-Policy", b"no-referrer"),
    (b"Content-Security-Policy",
     b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'"),
]


async def serve(
    site: Site,
    port: int = 0,
    *,
    host: str = "127.0.0.1",
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``site`` until cancelled; ``task_status.started`` gets the URL."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]
    hosts = {f"{host}:{bound}".encode(), f"localhost:{bound}".encode()}
    limiter = trio.CapacityLimiter(2)
    async with trio.open_nursery() as nursery:
        # Reading thousands of records takes seconds: start now, beside the requests.
        nursery.start_soon(trio.to_thread.run_sync, partial(site.warm, trio.from_thread.check_cancelled))
        task_status.started(f"http://{host}:{bound}/")
        await trio.serve_listeners(partial(_connection, site, hosts, limiter), listeners)


async def _connection(site: Site, hosts: set[bytes], limiter: trio.CapacityLimiter, stream: trio.SocketStream) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_REQUEST)
    try:
        while True:
            event = await _next_event(conn, stream)
            if event is None:
                return
            await _respond(site, hosts, limiter, conn, stream, event)
            if not _request_ended(conn) or conn.our_state is not h11.DONE:
                return  # a body the viewer does not read, or a closing peer
            conn.start_next_cycle()
    except (h11.ProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
        return
    finally:
        with trio.move_on_after(1, shield=True):
            await stream.aclose()


async def _next_event(conn: h11.Connection, stream: trio.SocketStream) -> h11.Request | None:
    """The next request, or None when the peer closes or stays idle too long."""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            with trio.move_on_after(_IDLE_SECONDS):
                conn.receive_data(await stream.receive_some(_MAX_REQUEST))
                continue
            return None
        if isinstance(event, h11.Request):
            return event
        return None


def _request_ended(conn: h11.Connection) -> bool:
    """Consume the (empty) body of a GET; False if there is more to read."""
    while conn.their_state is h11.SEND_BODY:
        event = conn.next_event()
        if event is h11.NEED_DATA or event is h11.PAUSED:
            return False
    return conn.their_state is h11.DONE


_TEXT = "text/plain; charset=utf-8"


async def _answer(
    site: Site, hosts: set[bytes], limiter: trio.CapacityLimiter, request: h11.Request
) -> tuple[int, bytes, str]:
    """Status, body and media type for ``request``."""
    if request.method not in (b"GET", b"HEAD"):
        return 405, b"read-only viewer\n", _TEXT
    if dict(request.headers).get(b"host") not in hosts:
        return 403, b"unexpected Host header\n", _TEXT
    path = unquote(urlsplit(request.target.decode("latin-1")).path).lstrip("/")
    if ".." in path.split("/"):
        return 404, b"not found\n", _TEXT
    try:
        found = await trio.to_thread.run_sync(site.get, path, limiter=limiter)
    except Exception as exc:  # noqa: BLE001 - one unreadable file must not stop the server
        return 500, f"cannot read {path}: {type(exc).__name__}\n".encode(), _TEXT
    if found is None:
        return 404, b"not found\n", _TEXT
    return 200, found[0], found[1]


async def _respond(
    site: Site,
    hosts: set[bytes],
    limiter: trio.CapacityLimiter,
    conn: h11.Connection,
    stream: trio.SocketStream,
    request: h11.Request,
) -> None:
    status, body, media = await _answer(site, hosts, limiter, request)
    headers = [
        (b"Content-Type", media.encode()),
        (b"Content-Length", str(len(body)).encode()),
        (b"Cache-Control", b"no-store"),
        *_SECURITY_HEADERS,
    ]
    if status == 405:
        headers.append((b"Allow", b"GET, HEAD"))
    await _send(conn, stream, h11.Response(status_code=status, headers=headers))
    if request.method != b"HEAD":
        await _send(conn, stream, h11.Data(data=body))
    await _send(conn, stream, h11.EndOfMessage())


async def _send(conn: h11.Connection, stream: trio.SocketStream, event: h11.Event) -> None:
    data = conn.send(event)
    if data:
        await stream.send_all(data)
