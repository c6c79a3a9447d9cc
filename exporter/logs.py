"""Log output in the exporter styles: logfmt (default) or JSON, one event per line, with fields.

Call sites pass fields with `extra={...}`; they appear as key=value pairs after the message.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
    "color_message",  # uvicorn's copy of the message with terminal colours
}
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "error": logging.ERROR}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    out: dict[str, Any] = {
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
        "level": record.levelname.lower().replace("warning", "warn"),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    out.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
    if record.exc_info:
        out["exc"] = logging.Formatter().formatException(record.exc_info)
    return out


def _logfmt_value(value: Any) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' ="\n\\'):
        return json.dumps(text)
    return text


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{k}={_logfmt_value(v)}" for k, v in _fields(record).items())


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record), default=str)


HTTP_LOGGER = "gpu_triage.exporter.http.server"
# uvicorn logs everything its server says, errors or not, as "uvicorn.error": give its lines our names.
_UVICORN = {
    "uvicorn.error": HTTP_LOGGER,
    "uvicorn.asgi": HTTP_LOGGER,
    "uvicorn.access": "gpu_triage.exporter.http.access",
}


class _FromUvicorn(logging.Filter):
    """Renames uvicorn's records, and makes its start and stop lines debug: ours ("listening", "stopping")
    already say so, with the addresses."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.name = _UVICORN.get(record.name, record.name)
        if record.name == HTTP_LOGGER and record.levelno == logging.INFO:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger().isEnabledFor(logging.DEBUG)
        return True


_from_uvicorn = _FromUvicorn()


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS[level])
    for name in _UVICORN:
        logging.getLogger(name).addFilter(_from_uvicorn)  # once: addFilter ignores a filter it has
