"""The model path: the ``openai-chat`` client, its per-endpoint pool, usage totals."""

from ._client import ChatClient as ChatClient
from ._client import ChatReply as ChatReply
from ._client import ModelError as ModelError
from ._client import ToolCall as ToolCall
from ._pool import ModelClients as ModelClients
from ._pool import chat_client as chat_client
from ._pool import open_model_clients as open_model_clients
from ._usage import ModelUsage as ModelUsage
