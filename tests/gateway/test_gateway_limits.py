"""The gateway enforces the run's budgets on the wire, for each API: once the
``tokens`` or ``cost_usd`` budget is used up the next call is answered 429 in
the API's own error shape and never reaches the upstream; its calls are
priced from ``ModelSpec.pricing`` (and the upstream's own reported cost)."""

from __future__ import annotations

import attrs
import httpx
import pytest

from agentcompass import Limits, Pricing
from agentcompass._models._budget import metering
from agentcompass.gateway import open_gateway
from agentcompass.testing.model_server import text

KEY = "sk-gateway-limits-REAL-KEY-5f2a"

ROUTES = {
    "openai-chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    "openai-responses": ("/v1/responses", {"input": "hi"}),
    "anthropic-messages": ("/v1/messages", {"max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}),
    "google-generate-content": (
        "/v1beta/models/scripted:generateContent",
        {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
    ),
}
#: Gemini streams on a route of its own, not on a body field.
GEMINI_STREAM = "/v1beta/models/scripted:streamGenerateContent?alt=sse"


def _client(gateway) -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport(uds=gateway.socket_path)
    return httpx.AsyncClient(transport=transport, base_url="http://gateway")


def _error_type(api: str, body: dict) -> str:
    if api == "google-generate-content":  # Google's shape: a status, not a type
        return "harness_limit_reached" if body["error"]["status"] == "RESOURCE_EXHAUSTED" else ""
    return body["error"]["type"] if api != "anthropic-messages" or body.get("type") == "error" else ""


@pytest.mark.parametrize("api", sorted(ROUTES))
@pytest.mark.parametrize(
    ("limits", "named"), [(Limits(tokens=40), "limits.tokens=40"), (Limits(cost_usd=5e-05), "limits.cost_usd=5e-05")]
)
@pytest.mark.parametrize("stream", [False, True])
async def test_past_a_token_or_cost_budget_the_call_is_refused_in_the_apis_shape(setup, api, limits, named, stream):
    server, model, env = await setup([text(str(n)) for n in range(6)], api)
    model = attrs.evolve(model, pricing=Pricing(input=1.0, output=2.0))  # 10 + 5 tokens: 2e-05 USD a call
    route, body = ROUTES[api]
    if api == "google-generate-content":
        route = GEMINI_STREAM if stream else route
    else:
        body = {"model": "scripted", **body, **({"stream": True} if stream else {})}
    with metering(limits) as meter:
        async with open_gateway(env, model) as gateway, _client(gateway) as client:
            headers = {"authorization": f"Bearer {gateway.token}", "x-api-key": gateway.token}
            replies = [await client.post(route, json=body, headers=headers) for _ in range(5)]
    assert [r.status_code for r in replies] == [200, 200, 200, 429, 429]
    assert len(server.requests) == 3  # the third crossed the budget; nothing after it went upstream
    refused = replies[3].json()
    assert _error_type(api, refused) == "harness_limit_reached" and named in str(refused)
    if api == "anthropic-messages":
        assert refused["type"] == "error"
    (issue,) = gateway.record.issues
    assert (issue.severity, issue.code) == ("error", "harness_limit_reached") and named in issue.message
    assert gateway.record.calls == 3 and gateway.record.refused == 2
    assert meter.tokens == 45 and meter.reached == named.split(".")[1].split("=")[0]
    assert gateway.record.usage.cost_usd == pytest.approx(3 * 2e-05)
    assert [e["usage"]["cost_usd"] for e in gateway.record.trajectory if e["role"] == "assistant"] == [
        pytest.approx(2e-05)
    ] * 3


async def test_a_cost_the_upstream_reports_is_used_without_pricing_and_left_out_when_absent(setup):
    plain = text("priced")
    reported = attrs.evolve(plain, body={**plain.body, "usage": {**plain.body["usage"], "cost": 0.0123}})
    server, model, env = await setup([reported, text("unpriced")])
    route, body = ROUTES["openai-chat"]
    async with open_gateway(env, model) as gateway, _client(gateway) as client:
        for _ in range(2):
            reply = await client.post(route, json={"model": "scripted", **body}, headers={"x-api-key": gateway.token})
            assert reply.status_code == 200
    first, second = (e["usage"] for e in gateway.record.trajectory if e["role"] == "assistant")
    assert first["cost_usd"] == 0.0123 and "cost_usd" not in second
    assert gateway.record.usage.cost_usd is None  # one call of unknown cost: the total is unknown, not 0.0123
