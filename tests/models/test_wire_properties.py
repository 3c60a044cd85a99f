"""Invariants of the Responses and Messages wire modules over generated
replies: a streamed reply, cut into any piece size, reads as the complete
one; and a reply sent back in the conversation is one assistant turn with
the same tool calls, whatever the API spreads it over."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from agentcompass._models import _messages_wire, _responses_wire
from agentcompass._models._wire import events_of
from agentcompass.testing import _messages_render, _responses_render
from agentcompass.testing.model_server import text, tool_calls

_text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)
_arguments = st.dictionaries(st.text(min_size=1, max_size=8), st.one_of(st.integers(), _text, st.booleans()), max_size=3)
_calls = st.lists(st.tuples(st.sampled_from(["bash", "read", "Write"]), _arguments), max_size=3)


@st.composite
def completions(draw):
    content = draw(st.one_of(st.none(), _text))
    calls = draw(_calls)
    if content is None and not calls:
        return text(draw(_text)).body
    made = [(name, arguments, f"call_{n}") for n, (name, arguments) in enumerate(calls)]
    return tool_calls(made, content=content, prompt_tokens=draw(st.integers(0, 10**6)),
                      completion_tokens=draw(st.integers(0, 10**6))).body  # fmt: skip


def _stream_of(events: list[bytes], assembler):
    stream = assembler()
    for event in events_of(b"".join(events).decode().splitlines()):
        stream.feed(event)
    return stream.result()


def _same(a, b) -> None:
    assert a.content == b.content
    assert [(c.id, c.name, json.loads(c.arguments)) for c in a.tool_calls] == [
        (c.id, c.name, json.loads(c.arguments)) for c in b.tool_calls
    ]
    assert a.usage == b.usage


@settings(max_examples=150, deadline=None)
@given(completions(), st.integers(1, 12))
def test_a_streamed_reply_reads_as_the_complete_one(completion, chunk_chars):
    whole = _responses_wire.parse_response(_responses_render.response_body(completion))
    streamed = _stream_of(_responses_render.response_events(completion, chunk_chars), _responses_wire.ResponsesStream)
    _same(streamed, whole)
    whole = _messages_wire.parse_message(_messages_render.message_body(completion))
    streamed = _stream_of(_messages_render.message_events(completion, chunk_chars), _messages_wire.MessagesStream)
    _same(streamed, whole)
    message = completion["choices"][0]["message"]
    assert whole.content == message["content"]
    assert whole.usage == {k: completion["usage"][k] for k in ("prompt_tokens", "completion_tokens")}


@settings(max_examples=150, deadline=None)
@given(completions())
def test_a_reply_sent_back_is_one_assistant_turn(completion):
    for wire, body, user, sent_back in (
        (_responses_wire, _responses_render.response_body,
         {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
         lambda reply: [{"type": "reasoning", "summary": []}, *reply.raw]),
        (_messages_wire, _messages_render.message_body, {"role": "user", "content": "go"},
         lambda reply: [reply.raw]),
    ):  # fmt: skip
        parse = wire.parse_response if wire is _responses_wire else wire.parse_message
        reply = parse(body(completion))
        key = "input" if wire is _responses_wire else "messages"
        entries = wire.conversation({key: [user, *sent_back(reply)]})
        assert [e["role"] for e in entries] == ["user", "assistant"]
        assert entries[1]["content"] == reply.content
        calls = [(c["id"], c["name"], json.loads(c["arguments"])) for c in entries[1].get("tool_calls", [])]
        assert calls == [(c.id, c.name, json.loads(c.arguments)) for c in reply.tool_calls]
