"""The APIs the gateway serves: per API its route, the request headers it
forwards, how its conversations and replies are read, and its error body.

Reading is the wire modules' (``_models._chat_wire``, ``_models._responses_wire``,
``_models._messages_wire``, ``_models._gemini_wire``); the app never
branches on the API.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs

from .._models import _chat_wire, _gemini_wire, _messages_wire, _responses_wire
from .._models._wire import Parsed, ReplyError, events_of
from . import _gemini

__all__ = ["API_OF", "Api"]


@attrs.frozen
class Api:
    """How the gateway serves one ``ModelSpec.api``.

    ``route``: the path the agent posts to (any prefix before it), or several;
    ``forward``: prefixes of (lower-case) request header names passed upstream as sent
    (never a credential: the upstream's key is the shared client's own);
    ``conversation(body)``: the request's conversation as trajectory entries;
    ``reply(data)`` / ``stream(data)``: a complete / streamed reply, raising
    ``ReplyError``; ``error(message, kind)``: an error body in the API's shape;
    ``key_header`` / ``key_query``: where else than ``Authorization`` and
    ``x-api-key`` the agent may send its token;
    ``upstream(client, path, query)``: the upstream URL and whether the call
    streams, for an API whose route names the model and the streaming (by
    default: the client's URL with the query as sent, streamed when the
    body says ``"stream": true``).
    """

    route: str | tuple[str, ...]
    forward: tuple[bytes, ...]
    conversation: Callable[[Any], list[dict[str, Any]]]
    reply: Callable[[bytes], Parsed]
    stream: Callable[[bytes], Parsed]
    error: Callable[[str, str], dict[str, Any]]
    key_header: bytes | None = None
    key_query: str | None = None
    upstream: Callable[[Any, str, bytes], tuple[Any, bool]] | None = None


def _openai_error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind}}


def _anthropic_error(message: str, kind: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def _json(parse: Callable[[Any], Parsed]) -> Callable[[bytes], Parsed]:
    def read(data: bytes) -> Parsed:
        try:
            body = json.loads(data)
        except ValueError:
            raise ReplyError("no_valid_output", "the reply is not JSON") from None
        return parse(body)

    return read


def _events(assembler: Callable[[], Any]) -> Callable[[bytes], Parsed]:
    def read(data: bytes) -> Parsed:
        stream = assembler()
        for event in events_of(data.decode("utf-8", errors="replace").splitlines()):
            stream.feed(event)
        result: Parsed = stream.result()
        return result

    return read


API_OF: dict[str, Api] = {
    "openai-chat": Api(
        "/chat/completions",
        (),
        _chat_wire.conversation,
        _json(_chat_wire.parse_completion),
        _events(_chat_wire.ChatStream),
        _openai_error,
    ),
    "openai-responses": Api(
        "/responses",
        (b"openai-beta",),
        _responses_wire.conversation,
        _json(_responses_wire.parse_response),
        _events(_responses_wire.ResponsesStream),
        _openai_error,
    ),
    "anthropic-messages": Api(
        "/messages",
        (b"anthropic-",),
        _messages_wire.conversation,
        _json(_messages_wire.parse_message),
        _events(_messages_wire.MessagesStream),
        _anthropic_error,
    ),
    "google-generate-content": Api(
        (":generateContent", ":streamGenerateContent"),
        (),
        _gemini_wire.conversation,
        _json(_gemini_wire.parse_reply),
        _events(_gemini_wire.GeminiStream),
        _gemini.error,
        key_header=b"x-goog-api-key",
        key_query="key",
        upstream=_gemini.upstream,
    ),
}
