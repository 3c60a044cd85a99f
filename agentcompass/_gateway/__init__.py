"""The model gateway: per-attempt endpoints an agent inside a session calls instead of the model."""

from ._gateway import TOKEN_VARIABLE as TOKEN_VARIABLE
from ._gateway import URL_VARIABLE as URL_VARIABLE
from ._gateway import Gateway as Gateway
from ._gateway import open_gateway as open_gateway
from ._record import GatewayRecord as GatewayRecord
