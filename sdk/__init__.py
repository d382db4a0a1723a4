"""Relay's Python SDK: `connect()` to a broker; the types and errors of the protocol."""

# The compiled units, when built and current (sdk/compiled.py), before any is imported.
from sdk.compiled import search_path

__path__ = search_path(__name__, __path__)

from sdk.aio import AsyncClient
from sdk.client import Client, connect
from sdk.errors import RelayError
from sdk.message import Message
from sdk.types import (
    AccessRule,
    Budget,
    EndpointInfo,
    Envelope,
    PublishResult,
    RuleAction,
    Signal,
    SignalType,
    StandardPayload,
    default_budget,
)

__all__ = [
    "AccessRule",
    "AsyncClient",
    "Budget",
    "Client",
    "EndpointInfo",
    "Envelope",
    "Message",
    "PublishResult",
    "RelayError",
    "RuleAction",
    "Signal",
    "SignalType",
    "StandardPayload",
    "connect",
    "default_budget",
]
