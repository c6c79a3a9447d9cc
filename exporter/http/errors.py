"""The one shape of every error the HTTP side answers: `{"error": message, "status": status, ...}`.

`error` answers from a route or an exception handler; `refuse` from a middleware, which runs before
the framework and sends the ASGI messages itself.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from fastapi.responses import JSONResponse

from gpu_triage.exporter.http.asgi import Send


def error(status: int, message: str, **extra: object) -> JSONResponse:
    return JSONResponse(_body(status, message, extra), status_code=status)


async def refuse(
    send: Send,
    status: int,
    message: str,
    *,
    close: bool = False,
    extra_headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """`close`: the body was not read, so the connection cannot carry another request (uvicorn would
    otherwise read the rest of it, however large)."""
    body = json.dumps(_body(status, message, {})).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": [*headers, *extra_headers]})
    await send({"type": "http.response.body", "body": body})


def _body(status: int, message: str, extra: dict[str, object]) -> dict[str, object]:
    return {"error": message, "status": status, **extra}
