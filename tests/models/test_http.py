"""The endpoints' HTTP clients (httpx's own transport) against real loopback
servers: pool slots under cancellation, stale keep-alive connections, proxies
and the trust store from the environment, the connect timeout, cookie jars."""

from __future__ import annotations

import socket

import httpx
import pytest
import trio
from _http_support import (
    MESSAGES,
    Answer,
    App,
    RawServer,
    Seen,
    completion,
    make_ca_and_server_cert,
    raw_serving,
    read_head,
    read_request,
    response,
    serving,
)

from agentcompass import ModelSpec
from agentcompass._models._http import CONNECT_TIMEOUT_SECONDS
from agentcompass.models import ModelError, chat_client, open_model_clients
from agentcompass.testing import hang_guard


def spec(url: str, **kwargs) -> ModelSpec:
    return ModelSpec("m", base_url=url, **kwargs)


@pytest.fixture(autouse=True)
def no_proxies_from_the_host(monkeypatch):
    """The tests' own environment decides which proxy is used."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


class Gate:
    """An app handler that holds every reply until :meth:`open`."""

    def __init__(self) -> None:
        self.event = trio.Event()

    async def __call__(self, _: Seen) -> Answer:
        await self.event.wait()
        return Answer()


async def _all_slots_answer_at_once(url: str, slots: int) -> None:
    """``slots`` concurrent calls all reach the server before any is answered:
    none of the pool's slots is lost."""
    gate = Gate()
    app = App(gate)
    async with serving(app) as origin, open_model_clients(1):
        client = chat_client(spec(origin + "/v1", max_connections=slots))
        async with trio.open_nursery() as nursery:
            for _ in range(slots):
                nursery.start_soon(client.chat, MESSAGES)
            await app.wait_until(lambda a: len(a.requests) == slots)
            gate.event.set()


@pytest.mark.parametrize("slots", [2, 20], ids=["one-pool", "shards"])
async def test_a_call_cancelled_while_the_pool_is_full_gives_every_slot_back(slots):
    gate = Gate()
    app = App(gate)
    async with hang_guard(20), serving(app) as origin, open_model_clients(1):
        client = chat_client(spec(origin + "/v1", max_connections=slots))
        async with trio.open_nursery() as nursery:
            for _ in range(slots):
                nursery.start_soon(client.chat, MESSAGES)
            await app.wait_until(lambda a: len(a.requests) == slots)  # every slot held
            for _ in range(3):  # each waits for a slot, and is cancelled there
                with trio.CancelScope() as waiting:
                    async with trio.open_nursery() as calls:
                        calls.start_soon(client.chat, MESSAGES)
                        await trio.testing.wait_all_tasks_blocked()
                        waiting.cancel()
            assert len(app.requests) == slots
            gate.event.set()
        # The pool serves as many calls at once as before, on the same connections.
        gate2 = Gate()
        app.handler = gate2
        async with trio.open_nursery() as nursery:
            for _ in range(slots):
                nursery.start_soon(client.chat, MESSAGES)
            await app.wait_until(lambda a: len(a.requests) == 2 * slots)
            gate2.event.set()
    assert len({r.headers["x-peer"] for r in app.requests}) == slots


async def test_a_pool_of_shards_holds_at_most_max_connections_and_reuses_them():
    gate = Gate()
    app = App(gate)
    async with hang_guard(20), serving(app) as origin, open_model_clients(1):
        client = chat_client(spec(origin + "/v1", max_connections=20))
        async with trio.open_nursery() as nursery:
            for _ in range(25):
                nursery.start_soon(client.chat, MESSAGES)
            await app.wait_until(lambda a: len(a.requests) == 20)
            await trio.testing.wait_all_tasks_blocked()
            assert len(app.requests) == 20  # five wait for a connection
            gate.event.set()
        for _ in range(10):
            await client.chat(MESSAGES)
    assert len(app.requests) == 35
    assert len({r.headers["x-peer"] for r in app.requests}) == 20


async def test_calls_cancelled_at_every_point_while_the_pool_is_free_give_every_slot_back():
    gate = Gate()  # never opened: a call that reaches the server waits there until cancelled
    app = App(gate)
    async with hang_guard(30), serving(app) as origin, open_model_clients(1):
        client = chat_client(spec(origin + "/v1", max_connections=2))
        reached = 0
        for points in range(60):
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as calls:
                    calls.start_soon(client.chat, MESSAGES)
                    for _ in range(points):
                        await trio.lowlevel.checkpoint()
                    scope.cancel()
            reached = len(app.requests)
        assert reached > 0  # the later cancellations landed mid-request
        before = len(app.requests)
        gate.event.set()
        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(client.chat, MESSAGES)
        assert len(app.requests) == before + 2
    async with hang_guard(20):
        await _all_slots_answer_at_once(origin, 2)


async def _close_after_reply(stream: trio.SocketStream, server: RawServer) -> None:
    """Answer one request, then close without having said so (no ``Connection: close``)."""
    if await read_request(stream, bytearray()) is not None:
        server.requests += 1
        await stream.send_all(response(completion(str(server.requests))))


async def test_300_calls_to_a_server_that_closes_after_each_reply_all_succeed():
    async with hang_guard(60), raw_serving(_close_after_reply) as (server, port), open_model_clients(1):
        client = chat_client(spec(f"http://127.0.0.1:{port}/v1", max_connections=4))
        replies = [(await client.chat(MESSAGES)).content for _ in range(300)]
    assert replies == [str(n) for n in range(1, 301)]
    assert server.connections == 300


async def _drop_the_second_request(stream: trio.SocketStream, server: RawServer) -> None:
    """Answer a connection's first request; close it when the second arrives,
    unanswered: the race of a keep-alive expiry, every time."""
    buffer = bytearray()
    if await read_request(stream, buffer) is None:
        return
    server.requests += 1
    await stream.send_all(response(completion(str(server.requests))))
    if await read_request(stream, buffer) is not None:
        server.heads.append(b"dropped")


async def test_a_request_that_met_a_stale_reused_connection_is_sent_again_once():
    async with hang_guard(20), raw_serving(_drop_the_second_request) as (server, port), open_model_clients(1):
        client = chat_client(spec(f"http://127.0.0.1:{port}/v1", max_connections=1))
        replies = [(await client.chat(MESSAGES)).content for _ in range(3)]
    assert replies == ["1", "2", "3"]
    assert server.heads == [b"dropped", b"dropped"]  # each reuse failed, and was sent again
    assert server.connections == 3


async def _close_unanswered(stream: trio.SocketStream, server: RawServer) -> None:
    if await read_request(stream, bytearray()) is not None:
        server.requests += 1


async def test_a_new_connection_closed_without_a_reply_is_not_retried():
    async with hang_guard(20), raw_serving(_close_unanswered) as (server, port), open_model_clients(1):
        with pytest.raises(ModelError) as info:
            await chat_client(spec(f"http://127.0.0.1:{port}/v1")).chat(MESSAGES)
    assert (info.value.severity, info.value.code) == ("fatal", "model_unreachable")
    assert server.requests == 1


async def _forward_proxy(stream: trio.SocketStream, server: RawServer) -> None:
    """A proxy of the test's own: records each request line, answers it itself."""
    buffer = bytearray()
    while (head := await read_request(stream, buffer)) is not None:
        server.heads.append(head.split(b"\r\n")[0])
        await stream.send_all(response(completion("via the proxy")))


async def test_http_proxy_from_the_environment_is_used(monkeypatch):
    async with hang_guard(20), raw_serving(_forward_proxy) as (proxy, port):
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
        async with open_model_clients(1):
            reply = await chat_client(spec("http://model.invalid/v1")).chat(MESSAGES)
        assert reply.content == "via the proxy"
        assert proxy.heads == [b"POST http://model.invalid/v1/chat/completions HTTP/1.1"]
        # NO_PROXY exempts a host: the call goes to it directly.
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        app = App()
        async with serving(app) as origin, open_model_clients(1):
            await chat_client(spec(origin + "/v1")).chat(MESSAGES)
        assert len(app.requests) == 1 and len(proxy.heads) == 1


async def _connect_proxy(stream: trio.SocketStream, server: RawServer) -> None:
    """An HTTPS proxy of the test's own: ``CONNECT host:port``, then bytes both ways."""
    head = await read_head(stream, bytearray())
    if head is None:
        return
    line = head.split(b"\r\n")[0]
    server.heads.append(line)
    host, _, port = line.split()[1].decode().rpartition(":")
    upstream = await trio.open_tcp_stream(host, int(port))
    await stream.send_all(b"HTTP/1.1 200 Connection established\r\n\r\n")

    async def pump(source: trio.abc.Stream, sink: trio.abc.Stream) -> None:
        try:
            while data := await source.receive_some(65536):
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        await trio.aclose_forcefully(sink)

    async with upstream, trio.open_nursery() as nursery:
        nursery.start_soon(pump, stream, upstream)
        nursery.start_soon(pump, upstream, stream)


async def test_ssl_cert_file_and_https_proxy_from_the_environment_are_used(tmp_path, monkeypatch):
    ca, cert, key = make_ca_and_server_cert(tmp_path)
    app = App()
    async with hang_guard(30), serving(app, cert, key) as origin:
        assert origin.startswith("https://")
        # Not in the trust store the test runs with: the certificate is refused.
        monkeypatch.delenv("SSL_CERT_DIR", raising=False)
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)
        async with open_model_clients(1):
            with pytest.raises(ModelError) as info:
                await chat_client(spec(origin + "/v1")).chat(MESSAGES)
        assert info.value.code == "model_unreachable" and "CERTIFICATE_VERIFY_FAILED" in info.value.message
        # SSL_CERT_FILE names the test CA: trusted.
        monkeypatch.setenv("SSL_CERT_FILE", str(ca))
        async with open_model_clients(1):
            assert (await chat_client(spec(origin + "/v1")).chat(MESSAGES)).content == "ok"
        assert len(app.requests) == 1
        # Through an HTTPS_PROXY: a CONNECT tunnel to the server, TLS end to end.
        async with raw_serving(_connect_proxy) as (proxy, port):
            monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{port}")
            async with open_model_clients(1):
                assert (await chat_client(spec(origin + "/v1")).chat(MESSAGES)).content == "ok"
        assert proxy.heads == [f"CONNECT {origin.removeprefix('https://')} HTTP/1.1".encode()]
        assert len(app.requests) == 2


async def test_connecting_is_bounded_by_the_short_connect_timeout():
    async with open_model_clients(1):
        timeout = chat_client(spec("http://127.0.0.1:9/v1")).http.timeout
        assert (timeout.connect, timeout.read, timeout.write, timeout.pool) == (CONNECT_TIMEOUT_SECONDS, 600, 600, 600)
        timeout = chat_client(spec("http://127.0.0.1:9/v1", timeout_seconds=3)).http.timeout
        assert (timeout.connect, timeout.read) == (3, 3)
    assert CONNECT_TIMEOUT_SECONDS <= 10


async def test_a_server_that_never_accepts_is_unreachable_after_the_connect_timeout():
    # A listening socket whose accept queue is full: the kernel drops further SYNs.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = []
        try:
            for _ in range(4):
                filler = socket.socket()
                filler.setblocking(False)
                filler.connect_ex(("127.0.0.1", port))
                fillers.append(filler)
            async with hang_guard(20), open_model_clients(1):
                client = chat_client(spec(f"http://127.0.0.1:{port}/v1", timeout_seconds=0.5))
                start = trio.current_time()
                with pytest.raises(ModelError) as info:
                    await client.chat(MESSAGES)
                took = trio.current_time() - start
        finally:
            for filler in fillers:
                filler.close()
    assert (info.value.severity, info.value.code) == ("fatal", "model_unreachable")
    assert "ConnectTimeout" in info.value.message and took < 5


async def test_each_endpoint_keeps_its_own_cookies():
    async def set_cookie(seen: Seen) -> Answer:
        return Answer(headers={"content-type": "application/json", "set-cookie": "affinity=a1; Path=/"})

    a, b = App(set_cookie), App()
    async with hang_guard(20), serving(a) as origin_a, serving(b) as origin_b, open_model_clients(2):
        client_a, client_b = chat_client(spec(origin_a + "/v1")), chat_client(spec(origin_b + "/v1"))
        await client_a.chat(MESSAGES)
        await client_a.chat(MESSAGES)
        await client_b.chat(MESSAGES)
    # Cookies go by host, not port: one jar for both would send A's cookie to B.
    assert "cookie" not in a.requests[0].headers and a.requests[1].headers["cookie"] == "affinity=a1"
    assert "cookie" not in b.requests[0].headers


async def test_a_transport_given_to_the_pool_replaces_httpx_pools_and_proxies(monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    seen = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(200, content=completion("mocked"))

    async with hang_guard(20), open_model_clients(2, transport=httpx.MockTransport(answer)):
        assert (await chat_client(spec("http://model.invalid/v1")).chat(MESSAGES)).content == "mocked"
    assert seen == ["http://model.invalid/v1/chat/completions"]
