"""The model path: a client per API, its per-endpoint pool, usage totals."""

from ._client import EndpointClient as EndpointClient
from ._client import ModelError as ModelError
from ._client import ToolCall as ToolCall
from ._gemini import GeminiClient as GeminiClient
from ._native import ChatClient as ChatClient
from ._native import ChatReply as ChatReply
from ._native import MessagesClient as MessagesClient
from ._native import ModelReply as ModelReply
from ._native import ResponsesClient as ResponsesClient
from ._pool import ModelClients as ModelClients
from ._pool import chat_client as chat_client
from ._pool import gemini_client as gemini_client
from ._pool import messages_client as messages_client
from ._pool import model_client as model_client
from ._pool import open_model_clients as open_model_clients
from ._pool import responses_client as responses_client
from ._usage import ModelUsage as ModelUsage
