"""The model client API: what a harness or a harness-free benchmark (plugins
included) calls its model with (``docs/models.md``).

``chat_client(model)`` returns the request's shared :class:`ChatClient` for a
``ModelSpec``; ``await client.chat(messages, tools=...)`` returns a
:class:`ChatReply` or raises :class:`ModelError`, an ``IssueError``
classified as SPEC 6 says. The runtime holds the clients open for a launch;
a program of its own opens them with ``async with open_model_clients(n):``.
"""

from ._models import ChatClient as ChatClient
from ._models import ChatReply as ChatReply
from ._models import ModelError as ModelError
from ._models import ModelUsage as ModelUsage
from ._models import ToolCall as ToolCall
from ._models import chat_client as chat_client
from ._models import open_model_clients as open_model_clients
from .runtime._public import publish as _publish

_publish(__name__, globals())
