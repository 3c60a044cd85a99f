"""The model clients' HTTP/1.1 transport against real loopback servers: connection
reuse and its limits, a server that closes idle connections, pool timeout, TLS."""

from __future__ import annotations

import os
import resource
import shutil
import ssl
import subprocess
from collections.abc import Awaitable, Callable

import attrs
import h11
import httpx
import pytest
import trio

from agentcompass._models._transport import H11Transport
from agentcompass.testing import hang_guard
from agentcompass.testing.model_server import ModelServer, text


async def _reply(stream: trio.abc.Stream, conn: h11.Connection, body: bytes, close: bool) -> bool:
    """Read one request from ``stream`` and answer ``body``; False if the client left."""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(65536)
            if not data:
                return False
            conn.receive_data(data)
        elif isinstance(event, h11.EndOfMessage):
            break
    headers = [("content-type", "application/json"), ("content-length", str(len(body)))]
    await stream.send_all(
        conn.send(h11.Response(status_code=200, headers=headers))
        + conn.send(h11.Data(data=body))
        + conn.send(h11.EndOfMessage())
    )
    if close:
        await stream.aclose()  # without saying so: no Connection: close header
        return False
    conn.start_next_cycle()
    return True


class RawServer:
    """An HTTP/1.1 server answering ``{"n": <request number>}``; ``close_after_reply``
    drops each connection after its reply without announcing it; ``ssl_context``
    serves TLS."""

    def __init__(self, close_after_reply: bool = False, ssl_context: ssl.SSLContext | None = None):
        self.close_after_reply = close_after_reply
        self.ssl_context = ssl_context
        self.connections = 0
        self.requests = 0
        self.closed = trio.Event()

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        handler: Callable[[trio.SocketStream], Awaitable[None]] = self._connection
        task_status.started(port)
        await trio.serve_listeners(handler, listeners)

    async def _connection(self, raw: trio.SocketStream) -> None:
        self.connections += 1
        stream: trio.abc.Stream = raw
        if self.ssl_context is not None:
            stream = trio.SSLStream(raw, self.ssl_context, server_side=True, https_compatible=True)
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                self.requests += 1
                body = b'{"n": %d}' % self.requests
                if not await _reply(stream, conn, body, self.close_after_reply):
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            await trio.aclose_forcefully(stream)
            self.closed.set()


async def test_keep_alive_connections_are_reused_until_they_expire():
    server = ModelServer([text(str(i)) for i in range(4)])
    async with hang_guard(20), trio.open_nursery() as nursery:
        url = await nursery.start(server.serve)
        async with httpx.AsyncClient(transport=H11Transport(4)) as client:
            for _ in range(2):
                assert (await client.post(url + "/chat/completions", json={})).status_code == 200
        assert server.connections == 1
        async with httpx.AsyncClient(transport=H11Transport(4, keepalive_seconds=0)) as client:
            for _ in range(2):
                assert (await client.post(url + "/chat/completions", json={})).status_code == 200
        assert server.connections == 3  # an expired idle connection is closed, never reused
        nursery.cancel_scope.cancel()


async def test_connections_on_descriptors_past_1024_are_reused_too():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if max(soft, hard if hard != resource.RLIM_INFINITY else 4096) < 1200:
        pytest.skip("needs 1200 file descriptors")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]  # the next socket gets a high number
    try:
        server = ModelServer([text("a"), text("b")])
        async with hang_guard(20), trio.open_nursery() as nursery:
            url = await nursery.start(server.serve)
            async with httpx.AsyncClient(transport=H11Transport(1)) as client:
                for _ in range(2):
                    assert (await client.post(url + "/chat/completions", json={})).status_code == 200
            nursery.cancel_scope.cancel()
        assert server.connections == 1
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_a_connection_the_server_announced_closing_is_not_reused():
    server = ModelServer([attrs.evolve(text("a"), headers={"Connection": "close"}), text("b")])
    async with hang_guard(20), trio.open_nursery() as nursery:
        url = await nursery.start(server.serve)
        transport = H11Transport(1)
        async with httpx.AsyncClient(transport=transport) as client:
            first = await client.post(url + "/chat/completions", json={})
            assert transport.connections == 0  # closed as the server announced
            second = await client.post(url + "/chat/completions", json={})
        assert first.status_code == second.status_code == 200
        assert server.connections == 2
        nursery.cancel_scope.cancel()


async def test_an_idle_connection_the_server_dropped_is_replaced_not_failed():
    server = RawServer(close_after_reply=True)
    async with hang_guard(20), trio.open_nursery() as nursery:
        port = await nursery.start(server.serve)
        transport = H11Transport(1)
        async with httpx.AsyncClient(transport=transport) as client:
            first = await client.get(f"http://127.0.0.1:{port}/")
            await server.closed.wait()  # the server closed the connection the pool keeps idle
            assert transport.connections == 1
            second = await client.get(f"http://127.0.0.1:{port}/")
        assert (first.json(), second.json()) == ({"n": 1}, {"n": 2})
        assert server.connections == 2
        nursery.cancel_scope.cancel()


async def test_waiting_for_a_connection_longer_than_the_pool_timeout_is_pool_timeout():
    server = RawServer()
    async with hang_guard(20), trio.open_nursery() as nursery:
        port = await nursery.start(server.serve)
        timeout = httpx.Timeout(10, pool=0.2)
        async with httpx.AsyncClient(transport=H11Transport(1), timeout=timeout) as client:
            async with client.stream("GET", f"http://127.0.0.1:{port}/") as held:  # holds the only slot
                with pytest.raises(httpx.PoolTimeout):
                    await client.get(f"http://127.0.0.1:{port}/")
                await held.aread()
            assert (await client.get(f"http://127.0.0.1:{port}/")).json() == {"n": 2}  # the slot came back
        nursery.cancel_scope.cancel()


@pytest.fixture
def tls_contexts(tmp_path):
    """(server, client) SSL contexts for 127.0.0.1 with a fresh self-signed certificate."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    client = ssl.create_default_context(cafile=str(cert))
    return server, client


async def test_a_reply_sent_before_the_request_was_read_is_returned_not_a_write_error():
    """A server may refuse a request by its head (413) and close without reading the body."""

    async def refuse(stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        while not isinstance(conn.next_event(), h11.Request):
            conn.receive_data(await stream.receive_some(65536))
        body = b'{"error": "too large"}'
        headers = [("content-length", str(len(body))), ("connection", "close")]
        await stream.send_all(
            conn.send(h11.Response(status_code=413, headers=headers)) + conn.send(h11.Data(data=body))
        )
        await stream.aclose()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with hang_guard(20), trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, refuse, listeners)
        transport = H11Transport(1)
        async with httpx.AsyncClient(transport=transport) as client:
            # Far more than the socket buffers hold: the send fails once the server has closed.
            response = await client.post(f"http://127.0.0.1:{port}/", content=b"x" * (64 << 20))
        assert response.status_code == 413 and response.json() == {"error": "too large"}
        assert transport.connections == 0
        nursery.cancel_scope.cancel()


async def test_https_is_served_over_tls_and_its_connections_reused(tls_contexts):
    server_context, client_context = tls_contexts
    server = RawServer(ssl_context=server_context)
    async with hang_guard(20), trio.open_nursery() as nursery:
        port = await nursery.start(server.serve)
        async with httpx.AsyncClient(transport=H11Transport(2, ssl_context=client_context)) as client:
            replies = [(await client.get(f"https://127.0.0.1:{port}/")).json() for _ in range(2)]
        assert replies == [{"n": 1}, {"n": 2}] and server.connections == 1
        # A server whose certificate the client does not trust cannot be connected to.
        async with httpx.AsyncClient(transport=H11Transport(1, ssl_context=ssl.create_default_context())) as client:
            with pytest.raises(httpx.ConnectError, match="TLS"):
                await client.get(f"https://127.0.0.1:{port}/")
        nursery.cancel_scope.cancel()
