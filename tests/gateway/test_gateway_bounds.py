"""The gateway's bounds (SPEC 12): the runtime's memory stays flat however
large and many an agent's calls, a body over the limit or nested past the
depth is a 4xx with one WARNING per attempt, what is recorded is bounded with
the bytes cut counted, and no relayed reply of any status, streamed or not,
carries the real key."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from agentcompass import GatewaySpec
from agentcompass._gateway._bounds import attempt_gateway, parse_body
from agentcompass.gateway import open_gateway
from agentcompass.testing.model_server import echo_headers, text

KEY = "sk-bounds-test-REAL-KEY-77c1e0"
MIB = 1024 * 1024


def _client(gateway) -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport(uds=gateway.socket_path)
    return httpx.AsyncClient(transport=transport, base_url="http://gateway/v1", timeout=60)


def _auth(gateway) -> dict[str, str]:
    return {"Authorization": f"Bearer {gateway.token}", "Content-Type": "application/json"}


def _scenario(calls: int, mib: int, limit_mib: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-m", "agentcompass.testing._gateway_load", str(calls), str(mib), str(limit_mib)],
        capture_output=True, text=True, env=env, timeout=600, check=True,
    )  # fmt: skip
    assert "Traceback" not in out.stderr, out.stderr
    return json.loads(out.stdout)


def test_thirty_calls_of_31_mib_leave_the_runtimes_memory_flat():
    # The body limit raised past the calls: every one is forwarded and recorded (within the record's bounds).
    result = _scenario(30, 31, 32)
    assert result["statuses"] == [200] * 30 and result["calls"] == 30
    growth_mib = (result["peak_kib"] - result["baseline_kib"]) / 1024
    print(f"peak RSS growth over 30 calls of {result['body_bytes'] / MIB:.1f} MiB: {growth_mib:.0f} MiB")
    # The body once in a buffer, its parse for the record, the client's own send: a few bodies, not 30,
    # and no more after 30 calls than after 3.
    assert growth_mib < 5 * 31, result
    assert result["peak_kib"] - result["peak_after_3_kib"] < 31 * 1024, result
    assert result["recorded_bytes"] <= 30 * GatewaySpec().record_request_bytes
    assert result["cut_bytes"] >= 30 * 31 * MIB - result["recorded_bytes"]


def test_thirty_calls_over_the_default_limit_are_413_with_one_warning_and_flat_memory():
    result = _scenario(30, 31, 8)
    assert all(status in (413, "RemoteProtocolError", "WriteError", "ReadError") for status in result["statuses"]), (
        result
    )
    assert 413 in result["statuses"], result
    assert result["calls"] == 0 and result["issues"] == ["gateway_refused"], result
    # What one refused upload leaves in flight (the server's buffers), not 30 bodies: flat after 3 calls.
    assert (result["peak_kib"] - result["baseline_kib"]) / 1024 < 5 * 31, result
    assert result["peak_kib"] - result["peak_after_3_kib"] < 31 * 1024, result


async def test_nested_json_is_400_never_forwarded_and_warned_once(setup):
    server, model, env = await setup([text("fine")])
    deep = b"[" * 100_000 + b"]" * 100_000
    objects = b'{"a":' * 129 + b"1" + b"}" * 129
    at_limit = json.dumps({"model": "scripted", "messages": [{"role": "user", "content": "[[[["}],
                           "x": json.loads("[" * 120 + "]" * 120)}).encode()  # fmt: skip
    async with open_gateway(env, model) as gateway, _client(gateway) as client:
        refused = [(await client.post("/chat/completions", content=b, headers=_auth(gateway))) for b in (deep, objects)]
        fine = await client.post("/chat/completions", content=at_limit, headers=_auth(gateway))
    assert [r.status_code for r in refused] == [400, 400]
    assert "nested deeper than 128" in refused[0].json()["error"]["message"]
    assert fine.status_code == 200 and len(server.requests) == 1 and server.requests[0].body == at_limit
    assert [(i.severity, i.code) for i in gateway.record.issues] == [("warning", "gateway_refused")]


def test_depth_is_told_without_a_frame_per_level():
    assert parse_body(b'{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}', 3) == ({"a": "[" * 40}, False)
    assert parse_body(b'[[["\\"[[[[[["]]]', 3)[1] is False
    assert parse_body(b'[[[["x"]]]]', 3)[1] is True
    assert parse_body(b'{"a": [{"b": [1]}]}', 4)[1] is False
    assert parse_body(b'{"a":' * 10**5, 128) == (None, True)  # the parser's own recursion limit: refused, not raised
    assert parse_body(b"[" * 3000 + b"]" * 3000, 128) == (None, True)
    assert parse_body(b"not json" + b"{" * 10**5, 128) == (None, False)  # not JSON: the upstream's to refuse


async def test_what_is_recorded_is_bounded_per_call_and_per_attempt_with_the_cut_counted(setup):
    server, model, env = await setup([text("r" * 500), text("short"), text("third")])
    spec = GatewaySpec(record_request_bytes=1000, record_reply_bytes=100, record_attempt_bytes=1400)
    body = {
        "model": "scripted",
        "messages": [{"role": "user", "content": "a" * 800}, {"role": "user", "content": "b" * 800}],
    }
    with attempt_gateway("acbounds0001", spec):
        async with open_gateway(env, model) as gateway, _client(gateway) as client:
            assert "acbounds0001" in gateway.socket_path
            first = await client.post("/chat/completions", json=body, headers=_auth(gateway))
            other = {"model": "scripted", "messages": [{"role": "user", "content": "c" * 300}]}
            second = await client.post("/chat/completions", json=other, headers=_auth(gateway))
            third = await client.post("/chat/completions", json={**other, "messages": [{"role": "user", "content": "d"}]},
                                      headers=_auth(gateway))  # fmt: skip
    assert first.json()["choices"][0]["message"]["content"] == "r" * 500  # the agent gets all of it
    record = gateway.record
    trajectory = record.trajectory
    # Call 1: 1000 of 1600 request characters kept (the second message shortened), 100 of 500 reply ones.
    assert trajectory[0]["content"] == "a" * 800 and trajectory[1]["content"] == "b" * 200
    assert trajectory[2]["content"] == "r" * 100 and trajectory[2]["cut_bytes"] == 600 + 400
    # Call 2: its request fills the attempt's 1400 (no room for its reply); call 3 is counts and sizes only.
    assert trajectory[3]["content"] == "c" * 300 and "content" not in trajectory[4] and trajectory[4]["cut_bytes"] == 5
    last = trajectory[-1]
    assert last["call"] == 3 and "content" not in last and last["request_bytes"] > 0 and last["reply_bytes"] > 0
    assert len(trajectory) == 6 and record.recorded_bytes == 1400 and record.usage.calls == 3
    assert record.cut_bytes == 600 + 400 + 5 + 1 + 5
    assert (first.status_code, second.status_code, third.status_code) == (200, 200, 200)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("status", [200, 500])
async def test_an_upstream_echoing_the_key_never_hands_it_to_the_agent(setup, stream, status):
    server, model, env = await setup([echo_headers(status)])
    body = {"model": "scripted", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    async with open_gateway(env, model) as gateway, _client(gateway) as client:
        async with client.stream("POST", "/chat/completions", json=body, headers=_auth(gateway)) as reply:
            chunks = [chunk async for chunk in reply.aiter_raw()]
    seen = b"".join(chunks)
    assert reply.status_code == status
    assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"  # the upstream had it, and echoed it
    assert b"authorization" in seen and b"**********" in seen
    assert KEY.encode() not in seen and KEY[10:].encode() not in seen
    assert KEY not in json.dumps(gateway.record.trajectory) and all(KEY not in i.message for i in gateway.record.issues)
