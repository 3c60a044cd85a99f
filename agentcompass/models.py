"""The model client API: what a harness or a harness-free benchmark (plugins
included) calls its model with (``docs/models.md``).

``chat_client(model)`` returns the request's shared :class:`ChatClient` for a
``ModelSpec`` with ``api: openai-chat``; ``await client.chat(messages,
tools=...)`` returns a :class:`ChatReply`. ``responses_client(model)``
(``api: openai-responses``) and ``messages_client(model)`` (``api:
anthropic-messages``) return a :class:`ResponsesClient` or
:class:`MessagesClient`, whose ``await client.create(...)`` returns a
:class:`ModelReply`; ``gemini_client(model)`` (``api:
google-generate-content``) returns a :class:`GeminiClient`, whose ``await
client.generate(...)`` returns one too; ``model_client(model)`` returns whichever the model's
api names. Every call raises :class:`ModelError`, an ``IssueError``
classified as SPEC 6 says. The runtime holds the clients open for a launch;
a program of its own opens them with ``async with open_model_clients(n):``.
"""

from ._models import ChatClient as ChatClient
from ._models import ChatReply as ChatReply
from ._models import GeminiClient as GeminiClient
from ._models import MessagesClient as MessagesClient
from ._models import ModelError as ModelError
from ._models import ModelReply as ModelReply
from ._models import ModelUsage as ModelUsage
from ._models import ResponsesClient as ResponsesClient
from ._models import ToolCall as ToolCall
from ._models import chat_client as chat_client
from ._models import gemini_client as gemini_client
from ._models import messages_client as messages_client
from ._models import model_client as model_client
from ._models import open_model_clients as open_model_clients
from ._models import responses_client as responses_client
from .runtime._public import publish as _publish

_publish(__name__, globals())
