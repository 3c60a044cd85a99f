"""The ``openai-chat``, ``openai-responses`` and ``anthropic-messages`` clients: one call, classified.

Each posts one request body to its endpoint's shared ``httpx.AsyncClient``
(``{base_url}/chat/completions`` and ``{base_url}/responses`` with
``Authorization: Bearer KEY``; ``{base_url}/messages`` with ``x-api-key:
KEY`` and ``anthropic-version``) and returns a :class:`ChatReply` (chat) or
a :class:`ModelReply`, or raises :class:`ModelError` with the
classification of ``_client``'s table. A streamed call (``stream=True``)
reads the API's server-sent events (``_chat_wire``, ``_responses_wire``,
``_messages_wire``) into the same reply; a server that answers a streamed
request with plain JSON is read as one. An error event inside a stream (a
chat chunk with an ``error``, Messages ``error``, Responses ``error`` or
``response.failed``) is FATAL ``model_server_error``.

A streamed chat call asks ``"stream_options": {"include_usage": true}`` and
assembles the chunks (text deltas, tool-call deltas by index, the usage of
the last chunk) into the same :class:`ChatReply` as a complete reply.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

import attrs

from ._chat_wire import ChatStream, parse_completion, request_body
from ._client import EndpointClient, ModelError, ToolCall
from ._cost import priced
from ._messages_wire import MessagesStream, parse_message
from ._responses_wire import ResponsesStream, parse_response
from ._wire import Parsed, ReplyError, SSEReader

if TYPE_CHECKING:
    import httpx

__all__ = ["DEFAULT_MAX_TOKENS", "ChatClient", "ChatReply", "MessagesClient", "ModelReply", "ResponsesClient"]

#: ``max_tokens`` of a Messages call that sets none (the API requires one).
DEFAULT_MAX_TOKENS = 4096


@attrs.frozen
class ModelReply:
    """The reply of one Responses or Messages call.

    ``content`` is its text (None when it has none); ``tool_calls`` its tool
    calls (``id`` is the Responses ``call_id`` or the Messages ``tool_use``
    id, which a tool result refers to; ``arguments`` JSON text); ``usage``
    holds ``prompt_tokens`` and ``completion_tokens`` (the API's
    ``input_tokens`` and ``output_tokens``, 0 when omitted);
    ``finish_reason`` is the response's ``status`` or the message's
    ``stop_reason``. ``output`` continues the conversation in the API's own
    format: for Responses the list of output items (append them to
    ``input``), for Messages the assistant message (append it to
    ``messages``).
    """

    content: str | None
    tool_calls: tuple[ToolCall, ...]
    usage: dict[str, int]
    finish_reason: str | None
    output: Any


@attrs.frozen
class ChatReply:
    """The assistant message of one chat completion.

    ``message`` is the message as the conversation should continue with it
    (OpenAI format: ``role``, ``content``, ``tool_calls``); ``usage`` holds
    ``prompt_tokens`` and ``completion_tokens`` (0 when the server omits them).
    """

    content: str | None
    tool_calls: tuple[ToolCall, ...]
    usage: dict[str, int]
    finish_reason: str | None
    message: dict[str, Any]


class _Stream(Protocol):
    def feed(self, event: dict[str, Any]) -> None: ...

    def result(self) -> Parsed: ...


_Reply = TypeVar("_Reply", ModelReply, ChatReply)


@attrs.define(eq=False)
class _NativeClient(EndpointClient, Generic[_Reply]):
    """A client whose replies a wire module parses (see the module docstring)."""

    def _parse(self, body: Any) -> Parsed:
        raise NotImplementedError

    def _stream(self) -> _Stream:
        raise NotImplementedError

    def _value(self, parsed: Parsed, usage: dict[str, int]) -> _Reply:
        raise NotImplementedError

    async def post(self, body: dict[str, Any], *, stream: bool = False) -> _Reply:
        """Post ``body`` as it is (no ``params`` added) and return the reply;
        ``stream`` says whether ``body`` asked for events. Raises :class:`ModelError`."""
        reply: _Reply = await self._exchange(body, stream, self._read, self._read_stream)
        return reply

    def _read(self, response: httpx.Response) -> _Reply:
        try:
            data = response.json()
        except ValueError:
            raise self._error("error", "no_valid_output", "the reply is not JSON") from None
        return self._reply(lambda: self._parse(data))

    async def _read_stream(self, response: httpx.Response) -> _Reply:
        assembler = self._stream()
        reader = SSEReader()

        def feed(event: dict[str, Any] | None) -> None:
            if event is not None:
                assembler.feed(event)

        try:
            async for line in response.aiter_lines():
                feed(reader.line(line))
            feed(reader.flush())
        except ReplyError as exc:
            raise self._classified(exc) from None
        return self._reply(assembler.result)

    def _reply(self, parse: Callable[[], Parsed]) -> _Reply:
        try:
            parsed = parse()
        except ReplyError as exc:
            raise self._classified(exc) from None
        return self._value(parsed, priced(parsed.usage, self.model.pricing))

    def _classified(self, exc: ReplyError) -> ModelError:
        return self._error("fatal" if exc.code == "model_server_error" else "error", exc.code, exc.detail)


@attrs.define(eq=False)
class _ModelClient(_NativeClient[ModelReply]):
    """A client whose replies are :class:`ModelReply` values (all but chat)."""

    def _value(self, parsed: Parsed, usage: dict[str, int]) -> ModelReply:
        return ModelReply(parsed.content, parsed.tool_calls, usage, parsed.finish_reason, parsed.raw)


@attrs.define(eq=False)
class ChatClient(_NativeClient[ChatReply]):
    """Chat completions (``api: openai-chat``) for one model over its endpoint's shared HTTP client.

    Obtain one with :func:`agentcompass.models.chat_client`; never build an
    ``httpx`` client of your own. It holds no connection itself: closing is
    the orchestration's job. Cancelling :meth:`chat` closes the connection
    the call was using (an interrupted HTTP/1.1 exchange cannot be reused).
    """

    path: ClassVar[str] = "/chat/completions"

    def _parse(self, body: Any) -> Parsed:
        return parse_completion(body)

    def _stream(self) -> ChatStream:
        return ChatStream()

    def _value(self, parsed: Parsed, usage: dict[str, int]) -> ChatReply:
        return ChatReply(parsed.content, parsed.tool_calls, usage, parsed.finish_reason, parsed.raw)

    async def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        stream: bool = False,
        **params: Any,
    ) -> ChatReply:
        """One completion of ``messages``; ``tools`` are OpenAI function tools.

        The request body is ``{"model", "messages", "tools"}`` plus the
        ModelSpec's ``params`` (temperature, max_tokens, ...), then ``params``
        given here. ``stream`` asks for the reply as server-sent events
        (see the module docstring); the reply is the same either way.
        Raises :class:`ModelError`.
        """
        body = request_body(self.model.name, messages, tools, stream)
        return await self.post(self._body(body, params), stream=stream)


@attrs.define(eq=False)
class ResponsesClient(_ModelClient):
    """The OpenAI Responses API (``api: openai-responses``) for one model over
    its endpoint's shared HTTP client. Obtain one with
    :func:`agentcompass.models.responses_client`; it holds no connection of
    its own (the orchestration closes the pool)."""

    path: ClassVar[str] = "/responses"

    def _parse(self, body: Any) -> Parsed:
        return parse_response(body)

    def _stream(self) -> ResponsesStream:
        return ResponsesStream()

    async def create(
        self,
        input: str | list[dict[str, Any]],
        *,
        instructions: str | None = None,
        tools: list[dict[str, Any]] | None = None,
        stream: bool = False,
        **params: Any,
    ) -> ModelReply:
        """One response to ``input`` (a string, or a list of input items:
        ``message``, ``function_call``, ``function_call_output``, ...).

        The body is ``{"model", "input", "instructions", "tools"}`` plus the
        ModelSpec's ``params``, then ``params`` given here (``store``,
        ``reasoning``, ...). ``stream`` asks for server-sent events; the
        reply is the same either way. Raises :class:`ModelError`.
        """
        body: dict[str, Any] = {"model": self.model.name, "input": input}
        if instructions is not None:
            body["instructions"] = instructions
        if tools:
            body["tools"] = tools
        if stream:
            body["stream"] = True
        return await self.post(self._body(body, params), stream=stream)


@attrs.define(eq=False)
class MessagesClient(_ModelClient):
    """The Anthropic Messages API (``api: anthropic-messages``) for one model
    over its endpoint's shared HTTP client. Obtain one with
    :func:`agentcompass.models.messages_client`; it holds no connection of
    its own (the orchestration closes the pool)."""

    path: ClassVar[str] = "/messages"

    def _parse(self, body: Any) -> Parsed:
        return parse_message(body)

    def _stream(self) -> MessagesStream:
        return MessagesStream()

    async def create(
        self,
        messages: list[dict[str, Any]],
        *,
        system: str | list[dict[str, Any]] | None = None,
        tools: list[dict[str, Any]] | None = None,
        stream: bool = False,
        **params: Any,
    ) -> ModelReply:
        """One assistant message after ``messages`` (``user`` and
        ``assistant`` messages whose content is text or blocks: ``text``,
        ``tool_use``, ``tool_result``).

        The body is ``{"model", "max_tokens", "messages", "system", "tools"}``
        plus the ModelSpec's ``params``, then ``params`` given here;
        ``max_tokens`` is :data:`DEFAULT_MAX_TOKENS` unless either sets it.
        ``stream`` asks for server-sent events; the reply is the same either
        way. Raises :class:`ModelError`.
        """
        body: dict[str, Any] = {"model": self.model.name, "max_tokens": DEFAULT_MAX_TOKENS, "messages": messages}
        if system is not None:
            body["system"] = system
        if tools:
            body["tools"] = tools
        if stream:
            body["stream"] = True
        return await self.post(self._body(body, params), stream=stream)
