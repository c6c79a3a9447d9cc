"""Raw ASGI, as the middleware speak it beneath the framework: the types, and a request's header."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of the header `name` (lower case, as ASGI gives names), None when absent."""
    for key, value in scope.get("headers", []):
        if key == name:
            return bytes(value)
    return None
