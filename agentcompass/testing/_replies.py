"""The scripted model server's replies: what a script answers, and what it is given.

A :class:`Reply` is one HTTP reply; its body is written as a chat
completion (:func:`text`, :func:`tool_call`, :func:`tool_calls`, built with
``_models._chat_wire``) and rendered in the wire format of the route that
asked. A :class:`RecordedRequest` is a request as the server received it; a
``Script`` maps one to its reply. See ``model_server`` for the whole.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from .._models._chat_wire import completion

__all__ = [
    "CHUNK_CHARS", "RecordedRequest", "Reply", "Script", "echo_headers", "empty_choices", "error", "malformed",
    "stream_error", "text", "tool_call", "tool_calls",
]  # fmt: skip

_ids = itertools.count(1)
#: The size of a streamed reply's content and arguments pieces, by default.
CHUNK_CHARS = 8


@attrs.frozen
class Reply:
    """One scripted HTTP reply. ``body`` is JSON-encoded unless it is ``bytes``
    (a chat completion is rendered in the route's API, and an error reply's
    ``None`` body as the API's error object); ``echo_headers`` replaces the
    body with the request's headers; ``stream_error`` ends a streamed reply
    with the API's error event.
    ``chunk_chars`` and ``chunk_delay`` shape the reply to a streaming request:
    the size of each content or arguments piece and the pause between events."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = attrs.Factory(dict)
    delay: float = 0.0
    echo_headers: bool = False
    chunk_chars: int = CHUNK_CHARS
    chunk_delay: float = 0.0
    #: Streamed: the reply's deltas, then the API's error event with this message.
    stream_error: str | None = None
    #: When > 0, the body goes out in pieces of this many bytes (a secret split across chunks).
    piece_bytes: int = 0

    def after(self, seconds: float) -> Reply:
        """This reply, sent ``seconds`` after the request arrived."""
        return attrs.evolve(self, delay=seconds)


@attrs.frozen
class RecordedRequest:
    """A request as the server received it (header names lower-case)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


def text(content: str, *, prompt_tokens: int = 10, completion_tokens: int = 5) -> Reply:
    """An assistant message with ``content`` and no tool call."""
    message = {"role": "assistant", "content": content}
    return Reply(body=completion(message, "stop", prompt_tokens, completion_tokens))


def tool_call(
    name: str,
    arguments: dict[str, Any] | str,
    *,
    call_id: str | None = None,
    content: str | None = None,
    prompt_tokens: int = 10,
    completion_tokens: int = 5,
) -> Reply:
    """An assistant message calling tool ``name`` with ``arguments`` (a dict is JSON-encoded)."""
    return tool_calls(
        [(name, arguments, call_id)], content=content, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
    )


def tool_calls(
    calls: Sequence[tuple[str, dict[str, Any] | str] | tuple[str, dict[str, Any] | str, str | None]],
    *,
    content: str | None = None,
    prompt_tokens: int = 10,
    completion_tokens: int = 5,
) -> Reply:
    """An assistant message with one tool call per ``(name, arguments[, call_id])``."""
    made = []
    for name, arguments, *rest in calls:
        args = arguments if isinstance(arguments, str) else json.dumps(arguments)
        call_id = (rest[0] if rest else None) or f"call_{next(_ids)}"
        made.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": args}})
    message = {"role": "assistant", "content": content, "tool_calls": made}
    return Reply(body=completion(message, "tool_calls", prompt_tokens, completion_tokens))


def error(status: int, *, headers: dict[str, str] | None = None, body: Any = None) -> Reply:
    """An HTTP error reply; ``body`` defaults to the route's API error object
    (``{"error": {"message": "scripted HTTP 500", ...}}``, or for Messages
    ``{"type": "error", "error": {"type": "overloaded_error", ...}}`` and the like)."""
    return Reply(status=status, body=body, headers=dict(headers or {}))


def stream_error(message: str = "scripted stream error", *, content: str = "partial") -> Reply:
    """A streamed reply that breaks: ``content``'s deltas, then the API's
    error event with ``message`` (chat: a ``data: {"error": ...}`` chunk;
    Responses: ``response.failed``; Messages: ``event: error``,
    ``overloaded_error``). A request that did not ask to stream gets HTTP 500."""
    return attrs.evolve(text(content), stream_error=message)


def malformed(body: str = '{"choices": [') -> Reply:
    """A 200 reply whose body is not valid JSON."""
    return Reply(body=body.encode())


def empty_choices() -> Reply:
    """A 200 reply with ``"choices": []``."""
    return Reply(body={"id": "chatcmpl-empty", "object": "chat.completion", "choices": [], "usage": {}})


def echo_headers(status: int = 500) -> Reply:
    """A reply whose body repeats every request header, ``Authorization``
    included: an error body for a status >= 400; for 200 a completion (in the
    route's API) whose text is the headers as JSON, streamed as one delta
    when asked to stream, and either way sent in 7-byte pieces, so that a
    secret in it is split across chunks."""
    return Reply(status=status, echo_headers=True, piece_bytes=7 if status == 200 else 0)


Script = Callable[[RecordedRequest], Reply]
