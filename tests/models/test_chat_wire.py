"""One reading of chat completions: the same hostile reply, complete or
streamed, from a real loopback server, is refused with the same code and the
same reason by the chat client and by the model gateway's record, a good
one reads the same through both, and the scripted server's stream of a reply
reads as the reply itself."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from _http_support import MESSAGES, Answer, App, Seen, serving
from hypothesis import given, settings
from hypothesis import strategies as st
from test_wire_properties import completions

from agentcompass import ModelSpec, NetworkPolicy
from agentcompass._models._chat_wire import MAX_TOOL_CALLS, ChatStream, conversation, parse_completion
from agentcompass._models._wire import ReplyError, events_of
from agentcompass.environments.local import LocalEnvironment
from agentcompass.gateway import open_gateway
from agentcompass.models import ModelError, chat_client, open_model_clients
from agentcompass.testing import hang_guard
from agentcompass.testing._chat_stream import sse_events

SSE = {"content-type": "text/event-stream"}


def _event(data: Any) -> bytes:
    return b"data: " + (data if isinstance(data, bytes) else json.dumps(data).encode()) + b"\n\n"


def _chunk(delta: Any) -> dict[str, Any]:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


def _reply(message: dict[str, Any]) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}


def _call(n: int, name: Any = "bash") -> dict[str, Any]:
    return {"id": f"c{n}", "type": "function", "function": {"name": name, "arguments": "{}"}}


_COMPLETE = {
    "content-parts": (
        _reply({"role": "assistant", "content": [{"type": "text", "text": "hi"}]}),
        "content is not text",
    ),
    "tool-calls-a-number": (_reply({"role": "assistant", "content": None, "tool_calls": 5}), "are not a list"),
    "tool-call-no-name": (_reply({"role": "assistant", "tool_calls": [_call(0, name=None)]}), "malformed tool call"),
    "too-many-tool-calls": (
        _reply({"role": "assistant", "tool_calls": [_call(n) for n in range(MAX_TOOL_CALLS + 1)]}),
        f"more than {MAX_TOOL_CALLS} tool calls",
    ),
    "second-choice-only": (
        {"choices": [{"index": 0, "message": {"role": "assistant", "content": None}}, _reply({"content": "x"})]},
        "neither content nor tool calls",
    ),
}
_STREAMED = {
    "chunk-not-json": ([b'{"choices": ['], "not JSON"),
    "chunk-a-list": ([b"[1, 2]"], "not an object"),
    "choices-a-string": ([{"choices": "abc"}], "are not a list"),
    "content-a-number": ([_chunk({"content": 7})], "content is not text"),
    "tool-call-a-string": ([_chunk({"tool_calls": ["bash"]})], "malformed tool call"),
    "tool-call-index-huge": (
        [_chunk({"tool_calls": [{"index": 10**12, "id": "c", "function": {"name": "bash"}}]})],
        f"index is not below {MAX_TOOL_CALLS}",
    ),
    "tool-call-never-named": ([_chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]})], "malformed"),
    "other-choice-only": ([{"choices": [{"index": 1, "delta": {"content": "x"}}]}], "has no choices"),
    "error-chunk": ([_chunk({"content": "par"}), {"error": {"message": "engine died"}}], "engine died"),
}


def _answer(body: Any, streamed: bool) -> Answer:
    if not streamed:
        return Answer(body=json.dumps(body).encode())
    return Answer(body=[_event(e) for e in body] + [_event(b"[DONE]")], headers=SSE)


async def _through_both(tmp_path, body: Any, streamed: bool) -> tuple[Any, Any]:
    """What the client makes of ``body`` (its reply or its ModelError), and the gateway's record of it."""

    async def handler(_: Seen) -> Answer:
        return _answer(body, streamed)

    async with hang_guard(30), serving(App(handler)) as origin, open_model_clients(2):
        model = ModelSpec("m", base_url=origin + "/v1")
        try:
            direct: Any = await chat_client(model).chat(MESSAGES, stream=streamed)
        except ModelError as exc:
            direct = exc
        env = await LocalEnvironment({"root": str(tmp_path)}).open(None, NetworkPolicy("full"), "wire-test")
        try:
            async with open_gateway(env, model) as gateway:
                transport = httpx.AsyncHTTPTransport(uds=gateway.socket_path)
                async with httpx.AsyncClient(transport=transport, base_url="http://gateway/v1") as http:
                    request = {"model": "m", "messages": MESSAGES, "stream": streamed}
                    auth = {"Authorization": f"Bearer {gateway.token}"}
                    relayed = await http.post("/chat/completions", json=request, headers=auth)
                assert relayed.status_code == 200
            record = gateway.record
        finally:
            await env.close()
    return direct, record


@pytest.mark.parametrize(
    ("case", "streamed"), [(c, False) for c in _COMPLETE] + [(c, True) for c in _STREAMED], ids=[*_COMPLETE, *_STREAMED]
)
async def test_a_hostile_reply_is_refused_alike_by_the_client_and_the_gateway(tmp_path, case, streamed):
    body, reason = (_STREAMED if streamed else _COMPLETE)[case]
    direct, record = await _through_both(tmp_path, body, streamed)
    assert isinstance(direct, ModelError), direct
    (issue,) = record.issues
    severity = "fatal" if case == "error-chunk" else "error"
    code = "model_server_error" if case == "error-chunk" else "no_valid_output"
    assert (direct.severity, direct.code) == (issue.severity, issue.code) == (severity, code)
    assert reason in direct.message and reason in issue.message
    # The wire's own words, once: both carry exactly the detail the one parser gives.
    detail = _detail(body, streamed)
    assert direct.message.endswith(detail) and detail in issue.message


def _detail(body: Any, streamed: bool) -> str:
    """The reason the wire module itself gives for ``body``."""
    try:
        if streamed:
            stream = ChatStream()
            for event in events_of(b"".join(_answer(body, True).body).decode().splitlines()):
                stream.feed(event)
            stream.result()
        else:
            parse_completion(body)
    except ReplyError as exc:
        return exc.detail
    raise AssertionError("the wire accepted a hostile reply")


async def test_a_good_reply_reads_the_same_through_the_client_and_the_gateway(tmp_path):
    message = {"role": "assistant", "content": "ok", "tool_calls": [_call(0)]}
    for streamed, body in (
        (False, {**_reply(message), "usage": {"prompt_tokens": 4, "completion_tokens": 2}}),
        (True, [
            _chunk({"role": "assistant", "content": "o"}), _chunk({"content": "k"}),
            _chunk({"tool_calls": [{"index": 0, "id": "c0", "function": {"name": "ba", "arguments": "{"}}]}),
            _chunk({"tool_calls": [{"index": 0, "function": {"name": "sh", "arguments": "}"}}]}),
            {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}},
        ]),
    ):  # fmt: skip
        direct, record = await _through_both(tmp_path, body, streamed)
        assert record.issues == []
        assert direct.content == "ok" and direct.usage == {"prompt_tokens": 4, "completion_tokens": 2}
        assert [(c.id, c.name, c.arguments) for c in direct.tool_calls] == [("c0", "bash", "{}")]
        assert direct.message["tool_calls"][0]["function"] == {"name": "bash", "arguments": "{}"}
        kept = record.trajectory[-1]
        assert kept["content"] == "ok" and kept["tool_calls"] == [{"id": "c0", "name": "bash", "arguments": "{}"}]
        assert record.usage.to_dict()["prompt_tokens"] == 4


@settings(max_examples=150, deadline=None)
@given(completions(), st.integers(1, 12), st.booleans())
def test_the_scripted_server_s_stream_reads_as_its_complete_reply(completion, chunk_chars, include_usage):
    whole = parse_completion(completion)
    stream = ChatStream()
    for event in events_of(b"".join(sse_events(completion, chunk_chars, include_usage)).decode().splitlines()):
        stream.feed(event)
    streamed = stream.result()
    assert (streamed.content, streamed.tool_calls, streamed.raw) == (whole.content, whole.tool_calls, whole.raw)
    assert streamed.usage == (whole.usage if include_usage else {"prompt_tokens": 0, "completion_tokens": 0})
    # The message a reply continues with is a request's assistant turn with the same calls.
    (turn,) = conversation({"messages": [whole.raw]})
    assert turn["content"] == whole.content
    assert [(c["id"], c["name"], c["arguments"]) for c in turn.get("tool_calls", [])] == [
        (c.id, c.name, c.arguments) for c in whole.tool_calls
    ]
