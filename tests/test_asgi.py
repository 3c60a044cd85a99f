"""The one request-body reader (``_asgi.read_body``): the model gateway and the
scripted model server each refuse a body one byte over their limit with 413
and take one at the limit, counting the bytes of a chunked body (no
``Content-Length`` to trust) as they arrive."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import trio

from agentcompass import GatewaySpec, ModelSpec, NetworkPolicy, Secret
from agentcompass._asgi import BodyRefused, read_body
from agentcompass._gateway._bounds import attempt_gateway
from agentcompass.environments.local import LocalEnvironment
from agentcompass.gateway import open_gateway
from agentcompass.models import open_model_clients
from agentcompass.testing import hang_guard
from agentcompass.testing.model_server import ModelServer, text

LIMIT = 4096


async def _chunked(size: int) -> AsyncIterator[bytes]:
    # A generator body: httpx sends it chunked, so only the bytes tell its size.
    for offset in range(0, size, 1000):
        yield b"x" * min(1000, size - offset)


async def _post_both(tmp_path, size: int) -> tuple[int, int, int, int]:
    """The statuses of a ``size``-byte chunked body sent to the scripted
    server and through the gateway, and the requests each forwarded/recorded."""
    server = ModelServer([text("ok")] * 4, max_body_bytes=LIMIT)
    async with hang_guard(30), trio.open_nursery() as nursery, open_model_clients(2):
        url = await nursery.start(server.serve)
        async with httpx.AsyncClient() as http:
            direct = (await http.post(url + "/chat/completions", content=_chunked(size))).status_code
        direct_seen = len(server.requests)
        model = ModelSpec("m", base_url=url, api_key=Secret("sk-asgi-test-key"))
        env = await LocalEnvironment({"root": str(tmp_path)}).open(None, NetworkPolicy("full"), "asgi-test")
        try:
            with attempt_gateway("asgi-test", GatewaySpec(max_body_bytes=LIMIT)):
                async with open_gateway(env, model) as gateway:
                    transport = httpx.AsyncHTTPTransport(uds=gateway.socket_path)
                    async with httpx.AsyncClient(transport=transport, base_url="http://gateway/v1") as http:
                        auth = {"Authorization": f"Bearer {gateway.token}"}
                        relayed = await http.post("/chat/completions", content=_chunked(size), headers=auth)
        finally:
            await env.close()
        nursery.cancel_scope.cancel()
    return direct, direct_seen, relayed.status_code, len(server.requests) - direct_seen


async def test_a_body_over_the_limit_is_refused_by_the_gateway_and_the_scripted_server(tmp_path):
    assert await _post_both(tmp_path, LIMIT + 1) == (413, 0, 413, 0)


async def test_a_body_at_the_limit_is_taken_by_both(tmp_path):
    assert await _post_both(tmp_path, LIMIT) == (200, 1, 200, 1)


@pytest.mark.parametrize(
    ("messages", "outcome"),
    [
        ([b"ab", b"cd"], bytearray(b"abcd")),
        ([b"ab", b"cde"], "over 4 bytes"),
        ([b"ab", None], "the client left"),
    ],
    ids=["at-limit", "over", "left"],
)
async def test_read_body_counts_the_bytes_as_they_arrive(messages, outcome):
    sent: list[dict] = []
    for n, piece in enumerate(messages):
        last = n == len(messages) - 1
        sent.append({"type": "http.disconnect"} if piece is None else
                    {"type": "http.request", "body": piece, "more_body": not last})  # fmt: skip
    pending = iter(sent)

    async def receive() -> dict:
        return next(pending)

    if isinstance(outcome, bytearray):
        assert await read_body(receive, 4) == outcome
    else:
        with pytest.raises(BodyRefused, match=outcome) as refused:
            await read_body(receive, 4)
        assert refused.value.left == (outcome == "the client left")
