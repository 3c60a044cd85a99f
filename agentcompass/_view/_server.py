"""The viewer's read-only HTTP server: a plain ASGI app on hypercorn's Trio worker.

It answers ``GET`` and ``HEAD`` of the :class:`~._site.Site`'s paths and
nothing else, listens on loopback only, and refuses a ``Host`` other than
the loopback address it serves (so a web page that rebinds a DNS name to
127.0.0.1 cannot read results). Reads of run directories run in worker
threads, two at a time, beside one background thread that reads every run's
task rows from the start, so the event loop never waits on a parse.

Plain ASGI rather than Starlette: the app is one route table that
:class:`Site` already is, and Starlette is not a dependency.
"""

from __future__ import annotations

import gzip
from functools import partial
from typing import Any
from urllib.parse import unquote

import trio

from .._asgi import lifespan, listen, serve_asgi
from ._site import Site, versioned

__all__ = ["serve"]

_IDLE_SECONDS = 60  # a keep-alive connection nobody uses is closed
#: Bodies this large are sent gzipped to a client that takes it (a 10,000-task
#: run page is 0.9 MB of JSON, a tenth of that compressed).
_GZIP_BYTES = 64 * 1024
_TEXT = "text/plain; charset=utf-8"
_SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'",
    ),
]


async def serve(
    site: Site,
    port: int = 0,
    *,
    host: str = "127.0.0.1",
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``site`` until cancelled; ``task_status.started`` gets the URL.

    A port that cannot be bound raises ``OSError`` before anything starts."""
    listener = listen(port, host)
    bound = listener.getsockname()[1]
    hosts = {f"{host}:{bound}".encode(), f"localhost:{bound}".encode()}
    app = partial(_app, site, hosts, trio.CapacityLimiter(2), {})
    with listener:
        async with trio.open_nursery() as nursery:
            # Reading thousands of records takes seconds: start now, beside the requests.
            nursery.start_soon(trio.to_thread.run_sync, partial(site.warm, trio.from_thread.check_cancelled))
            await nursery.start(partial(serve_asgi, app, listener, keep_alive_seconds=_IDLE_SECONDS))
            task_status.started(f"http://{host}:{bound}/")


async def _app(
    site: Site, hosts: set[bytes], limiter: trio.CapacityLimiter, zipped: dict[str, tuple[bytes, bytes]],
    scope: Any, receive: Any, send: Any,
) -> None:
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    if scope["type"] != "http":
        return  # hypercorn refuses a WebSocket the app does not accept
    status, body, media = await _answer(site, hosts, limiter, scope)
    # Data may change between two requests; the script and style the page
    # names by content (and only those URLs) never do.
    keep = status == 200 and versioned(scope["path"].lstrip("/"), scope.get("query_string", b""))
    cache = b"max-age=31536000, immutable" if keep else b"no-store"
    headers = [(b"content-type", media.encode()), (b"cache-control", cache), (b"vary", b"accept-encoding")]
    if status == 200 and len(body) >= _GZIP_BYTES and b"gzip" in dict(scope["headers"]).get(b"accept-encoding", b""):
        # The site answers a cached run page with the same bytes object: compress it once.
        path = scope["path"]
        cached = zipped.get(path)
        if cached is None or cached[0] is not body:
            cached = (body, await trio.to_thread.run_sync(partial(gzip.compress, body, 1, mtime=0), limiter=limiter))
            if path.endswith("/run.js"):  # one a run: the others are not asked for twice
                zipped[path] = cached
        body = cached[1]
        headers.append((b"content-encoding", b"gzip"))
    headers += [(b"content-length", str(len(body)).encode()), *_SECURITY_HEADERS]
    if status == 405:
        headers.append((b"allow", b"GET, HEAD"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})


async def _answer(site: Site, hosts: set[bytes], limiter: trio.CapacityLimiter, scope: Any) -> tuple[int, bytes, str]:
    """Status, body and media type for the request of ``scope``."""
    if scope["method"] not in ("GET", "HEAD"):
        return 405, b"read-only viewer\n", _TEXT
    if dict(scope["headers"]).get(b"host") not in hosts:
        return 403, b"unexpected Host header\n", _TEXT
    raw = scope.get("raw_path")
    path = (unquote(raw.decode("latin-1")) if raw else scope["path"]).lstrip("/")
    if ".." in path.split("/"):
        return 404, b"not found\n", _TEXT
    try:
        found = await trio.to_thread.run_sync(site.get, path, limiter=limiter)
    except Exception as exc:  # noqa: BLE001 - one unreadable file must not stop the server
        return 500, f"cannot read {path}: {type(exc).__name__}\n".encode(), _TEXT
    if found is None:
        return 404, b"not found\n", _TEXT
    return 200, found[0], found[1]
