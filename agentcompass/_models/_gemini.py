"""The ``google-generate-content`` client: Gemini's ``generateContent``, one call, classified.

It posts one request body to ``{base_url}/models/{model}:generateContent``
(streamed: ``:streamGenerateContent?alt=sse``) on its endpoint's shared
``httpx.AsyncClient``, the key in the ``x-goog-api-key`` header (never in
the URL, where logs and proxies would see it), and returns a
:class:`~agentcompass.models.ModelReply` or raises ``ModelError`` with
``_client``'s classification; ``_gemini_wire`` reads the replies. The
model is named by the URL, not the body. ``base_url`` is the API's version
root, e.g. ``https://generativelanguage.googleapis.com/v1beta``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import quote

import attrs

from ._gemini_wire import GeminiStream, parse_reply
from ._native import ModelReply, _ModelClient
from ._wire import Parsed

if TYPE_CHECKING:
    import httpx

__all__ = ["GeminiClient", "model_path"]


def model_path(base: httpx.URL, model: str, stream: bool) -> httpx.URL:
    """``base``'s URL of ``model``'s (streamed) generate method; a name given
    as ``models/NAME`` is NAME, and the name is one path segment, escaped."""
    name = quote(model.removeprefix("models/"), safe="")
    method = "streamGenerateContent" if stream else "generateContent"
    url = base.copy_with(path=base.path.rstrip("/") + f"/models/{name}:{method}")
    return url.copy_with(params={"alt": "sse"}) if stream else url


@attrs.define(eq=False)
class GeminiClient(_ModelClient):
    """The Gemini API (``api: google-generate-content``) for one model over
    its endpoint's shared HTTP client. Obtain one with
    :func:`agentcompass.models.gemini_client`; it holds no connection of its
    own (the orchestration closes the pool)."""

    #: The endpoint's URL is its ``base_url``: the model's method is added per client.
    path: ClassVar[str] = ""
    stream_url: httpx.URL | None = None

    def __attrs_post_init__(self) -> None:
        import httpx

        base = self.url if self.url is not None else httpx.URL(self.model.base_url or "")
        self.url = model_path(base, self.model.name, stream=False)
        self.stream_url = model_path(base, self.model.name, stream=True)

    def _parse(self, body: Any) -> Parsed:
        return parse_reply(body)

    def _stream(self) -> GeminiStream:  # type: ignore[override]
        return GeminiStream()

    async def post(self, body: dict[str, Any], *, stream: bool = False) -> ModelReply:
        """Post ``body`` as it is (no ``params`` added) to the generate method,
        streamed or not, and return the reply. Raises ``ModelError``."""
        url = self.stream_url if stream else self.url
        reply: ModelReply = await self._exchange(body, stream, self._read, self._read_stream, url)
        return reply

    async def generate(
        self,
        contents: str | list[dict[str, Any]],
        *,
        system_instruction: str | dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
        stream: bool = False,
        **params: Any,
    ) -> ModelReply:
        """One model turn after ``contents`` (a string, or ``user`` and
        ``model`` turns whose ``parts`` are ``text``, ``functionCall``,
        ``functionResponse``, ...).

        The body is ``{"contents", "systemInstruction", "tools"}`` plus the
        ModelSpec's ``params`` (``generationConfig``, ``toolConfig``, ...),
        then ``params`` given here. ``tools`` are Gemini tools
        (``[{"functionDeclarations": [...]}]``). ``stream`` reads the reply
        as server-sent events; the reply is the same either way; its
        ``output`` is the ``model`` turn to append to ``contents``. Raises
        ``ModelError``.
        """
        if isinstance(contents, str):
            contents = [{"role": "user", "parts": [{"text": contents}]}]
        body: dict[str, Any] = {"contents": contents}
        if system_instruction is not None:
            if isinstance(system_instruction, str):
                system_instruction = {"parts": [{"text": system_instruction}]}
            body["systemInstruction"] = system_instruction
        if tools:
            body["tools"] = tools
        return await self.post(self._body(body, params), stream=stream)
