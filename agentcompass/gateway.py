"""The model gateway API: how a harness (plugins included) lets a program it
runs inside the session call the request's model without ever holding its
key (SPEC 10 "Model gateway", ``docs/agents.md``), in the model's own API:
chat completions, the OpenAI Responses API or the Anthropic Messages API
(``Gateway.api``).

``async with open_gateway(env, model, max_model_calls=N) as gateway:``
serves the attempt's endpoint for the block; run the agent with
``gateway.command(cmd)`` (it sets ``AGENTCOMPASS_GATEWAY_URL`` and
``AGENTCOMPASS_GATEWAY_TOKEN``), then return ``gateway.record``'s
trajectory, usage and issues with the result.
"""

from ._gateway import TOKEN_VARIABLE as TOKEN_VARIABLE
from ._gateway import URL_VARIABLE as URL_VARIABLE
from ._gateway import Gateway as Gateway
from ._gateway import GatewayRecord as GatewayRecord
from ._gateway import open_gateway as open_gateway
from .runtime._public import publish as _publish

_publish(__name__, globals())
