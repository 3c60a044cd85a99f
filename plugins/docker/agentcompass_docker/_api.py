"""The Docker Engine API over its unix socket, through one ``httpx.AsyncClient``.

Only what the provider needs: JSON requests, streamed bodies (build, pull,
archives) and the multiplexed stream of an exec. The API version is pinned
to 1.41 (Docker 20.10, and what Podman's compatible service speaks), so the
same requests work on every daemon the provider supports.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from agentcompass.runtime import OutputCallback, OutputStream

API_VERSION = "v1.41"
#: Connect and pool-wait bound of a request; reads are bounded by the caller's scope.
CONNECT_SECONDS = 10.0


class EngineError(Exception):
    """The daemon answered with an error status (``status`` and its message)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"docker daemon answered {status}: {message}")
        self.status = status
        self.message = message


def socket_path(host: str) -> str:
    """The unix socket path of ``host`` (``unix:///run/docker.sock``); raise ``ValueError`` for anything else."""
    if not host.startswith("unix://") or len(host) <= len("unix://"):
        raise ValueError(f"docker host {host!r} must be a unix socket (unix:///path/to/docker.sock)")
    return host[len("unix://") :]


class Engine:
    """One client to one daemon, for the provider's lifetime (see :meth:`aclose`).

    Connections are not kept alive between requests: a unix socket connects
    in microseconds, and a provider instance the runtime drops (it has no
    close hook) then holds no socket open.
    """

    def __init__(self, host: str, max_connections: int = 64):
        self.host = host
        transport = httpx.AsyncHTTPTransport(
            uds=socket_path(host), limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=0)
        )
        # The base URL's host is never resolved: every request goes to the socket.
        self._client = httpx.AsyncClient(
            transport=transport,
            base_url=f"http://docker/{API_VERSION}",
            timeout=httpx.Timeout(None, connect=CONNECT_SECONDS, pool=CONNECT_SECONDS),
            trust_env=False,
            # Raw bytes, so what is read is what is counted (no decompression on this side).
            headers={"Accept-Encoding": "identity"},
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: Any = None,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
        ok: tuple[int, ...] = (200, 201, 204),
    ) -> Any:
        """Send one request; return its JSON body (``None`` when empty); raise
        :class:`EngineError` for a status outside ``ok``."""
        response = await self._client.request(
            method, path, params=_params(params), json=body, content=content, headers=headers
        )
        if response.status_code not in ok:
            raise EngineError(response.status_code, _message(response.content))
        if not response.content:
            return None
        if response.headers.get("content-type", "").startswith("application/json"):
            return response.json()
        return response.content

    async def path_stat(self, container: str, path: str) -> dict[str, Any] | None:
        """What the daemon's archive endpoint says of ``path`` in ``container``
        (``name``, ``size``, ``mode`` as Go's ``FileMode``, ``mtime``,
        ``linkTarget``), or ``None`` when there is nothing there."""
        response = await self._client.head(f"/containers/{container}/archive", params={"path": path})
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise EngineError(response.status_code, f"stat of {path} failed")
        try:
            stat = json.loads(base64.b64decode(response.headers.get("x-docker-container-path-stat", "")))
        except ValueError:
            raise EngineError(response.status_code, f"unreadable stat of {path}") from None
        return stat if isinstance(stat, dict) else None

    @asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: Any = None,
        content: Any = None,
        headers: dict[str, str] | None = None,
    ) -> AsyncIterator[httpx.Response]:
        """A streamed response whose status is already checked (an error
        status raises :class:`EngineError` with at most 64 KiB of its body read)."""
        request = self._client.build_request(
            method, path, params=_params(params), json=body, content=content, headers=headers
        )
        response = await self._client.send(request, stream=True)
        try:
            if response.status_code >= 300:
                raise EngineError(response.status_code, _message(await _bounded(response, 65536)))
            yield response
        finally:
            await response.aclose()


def _params(params: dict[str, Any] | None) -> dict[str, str] | None:
    if params is None:
        return None
    out = {}
    for key, value in params.items():
        if value is None:
            continue
        if isinstance(value, bool):
            out[key] = "1" if value else "0"
        elif isinstance(value, dict | list):
            out[key] = json.dumps(value)
        else:
            out[key] = str(value)
    return out


def _message(content: bytes) -> str:
    try:
        return str(json.loads(content).get("message", ""))[:2000] or content[:2000].decode(errors="replace")
    except (ValueError, AttributeError):
        return content[:2000].decode(errors="replace").strip()


async def _bounded(response: httpx.Response, limit: int) -> bytes:
    data = bytearray()
    async for chunk in response.aiter_raw():
        data += chunk
        if len(data) >= limit:
            break
    return bytes(data[:limit])


async def read_json_lines(response: httpx.Response, on_line: Any, limit: int = 1 << 20) -> None:
    """Hand each JSON object of a build/pull progress stream to ``on_line``
    (lines longer than ``limit`` are cut: the daemon's, but bounded anyway)."""
    buffer = bytearray()
    async for chunk in response.aiter_raw():
        buffer += chunk
        while (end := buffer.find(b"\n")) >= 0:
            line = bytes(buffer[:end])
            del buffer[: end + 1]
            _emit(line, on_line)
        if len(buffer) > limit:
            _emit(bytes(buffer[:limit]), on_line)
            buffer.clear()
    _emit(bytes(buffer), on_line)


def _emit(line: bytes, on_line: Any) -> None:
    line = line.strip()
    if not line:
        return
    try:
        item = json.loads(line)
    except ValueError:
        item = {"stream": line.decode(errors="replace")}
    if isinstance(item, dict):
        on_line(item)


_FRAME_HEADER = 8
_STREAMS: dict[int, OutputStream] = {1: "stdout", 2: "stderr"}


async def demultiplex(response: httpx.Response, on_output: OutputCallback) -> None:
    """Hand each frame of the daemon's multiplexed stream to ``on_output``."""
    buffer = bytearray()
    async for chunk in response.aiter_raw():
        buffer += chunk
        while len(buffer) >= _FRAME_HEADER:
            kind = buffer[0]
            size = int.from_bytes(buffer[4:8], "big")
            if len(buffer) < _FRAME_HEADER + size:
                break
            payload = bytes(buffer[_FRAME_HEADER : _FRAME_HEADER + size])
            del buffer[: _FRAME_HEADER + size]
            stream = _STREAMS.get(kind)
            if stream is not None and payload:
                await on_output(stream, payload)
