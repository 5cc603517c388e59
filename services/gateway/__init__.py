"""The HTTP gateway: OpenAI Chat / Responses / Completions and Anthropic Messages in front of a
`WorkerClient`."""

from services.gateway.app import create_app, serve
from services.gateway.limits import GatewayLimits

__all__ = ["GatewayLimits", "create_app", "serve"]
