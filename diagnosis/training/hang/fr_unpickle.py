"""Unpickling Flight Recorder dumps without running anything they say.

A pickle is a program: its GLOBAL and REDUCE instructions import and call whatever they name, so
`pickle.load` of a file someone uploaded is code execution. PyTorch writes its dumps with its own C++
pickler (protocol 2), from plain values only: dicts, lists, tuples, strings, integers, floats, booleans
and None. `loads` admits exactly those.

Two layers. `scan` walks the instructions before anything is built and refuses every one that is not
a plain value, a container or the memo, so no import, call or object construction is ever reached; it
also refuses a memo index larger than the instructions before it could have stored (CPython's C
unpickler grows its memo to twice the largest index it is told to store, so a 9-byte pickle could ask
for gigabytes). Then the C unpickler builds the values, with `find_class` and `persistent_load`
refusing as well, should the scan ever let one through. The scan is a Python loop (about 0.1 s per
1,000-entry dump); `load_unscanned` skips it for callers that bound the process's memory themselves
(the daemon's and the CLI's decoding processes, see exporter/fr_decode.py).
"""

from __future__ import annotations

import io
import pickle
from typing import Any

__all__ = ["UnsafePickleError", "load_unscanned", "loads", "scan"]


class UnsafePickleError(ValueError):
    """A pickle that holds more than plain values, or that is broken."""


# Instructions of plain values and containers, and how many argument bytes follow each.
_FIXED = {
    0x28: 0,  # ( MARK
    0x2E: 0,  # . STOP
    0x30: 0,  # 0 POP
    0x31: 0,  # 1 POP_MARK
    0x32: 0,  # 2 DUP
    0x4E: 0,  # N NONE
    0x88: 0,  # NEWTRUE
    0x89: 0,  # NEWFALSE
    0x29: 0,  # ) EMPTY_TUPLE
    0x5D: 0,  # ] EMPTY_LIST
    0x7D: 0,  # } EMPTY_DICT
    0x8F: 0,  # EMPTY_SET
    0x90: 0,  # ADDITEMS
    0x91: 0,  # FROZENSET
    0x61: 0,  # a APPEND
    0x65: 0,  # e APPENDS
    0x6C: 0,  # l LIST
    0x74: 0,  # t TUPLE
    0x64: 0,  # d DICT
    0x73: 0,  # s SETITEM
    0x75: 0,  # u SETITEMS
    0x85: 0,  # TUPLE1
    0x86: 0,  # TUPLE2
    0x87: 0,  # TUPLE3
    0x94: 0,  # MEMOIZE
    0x4B: 1,  # K BININT1
    0x68: 1,  # h BINGET
    0x71: 1,  # q BINPUT
    0x80: 1,  # PROTO
    0x4D: 2,  # M BININT2
    0x4A: 4,  # J BININT
    0x6A: 4,  # j LONG_BINGET
    0x72: 4,  # r LONG_BINPUT
    0x47: 8,  # G BINFLOAT
    0x95: 8,  # FRAME
}
_LEN1 = {0x8C, 0x43, 0x55, 0x8A}  # SHORT_BINUNICODE, SHORT_BINBYTES, SHORT_BINSTRING, LONG1
_LEN4 = {0x58, 0x42, 0x54}  # BINUNICODE, BINBYTES, BINSTRING
_LEN8 = {0x8D, 0x8E}  # BINUNICODE8, BINBYTES8
_LONG4 = 0x8B
_MAX_LONG_BYTES = 64  # integers PyTorch writes fit in 8 bytes


def scan(data: bytes) -> None:
    """Raise UnsafePickleError unless `data` is one pickle of plain values (see the module docstring)."""
    i, n, ops = 0, len(data), 0
    fixed, len1, len4 = _FIXED, _LEN1, _LEN4
    while i < n:
        op = data[i]
        i += 1
        ops += 1
        size = fixed.get(op)
        if size is not None:
            if op == 0x72 and int.from_bytes(data[i : i + 4], "little") > ops:
                raise UnsafePickleError(f"memo index out of range at byte {i - 1}")
            if op == 0x2E:
                return
            i += size
        elif op in len1:
            if i >= n:
                break
            if op == 0x8A and data[i] > _MAX_LONG_BYTES:
                raise UnsafePickleError(f"an integer of {data[i]} bytes at byte {i - 1}")
            i += 1 + data[i]
        elif op in len4:
            i += 4 + int.from_bytes(data[i : i + 4], "little")
        elif op in _LEN8:
            i += 8 + int.from_bytes(data[i : i + 8], "little")
        elif op == _LONG4:
            raise UnsafePickleError(f"an integer longer than {_MAX_LONG_BYTES} bytes at byte {i - 1}")
        else:
            raise UnsafePickleError(f"instruction {chr(op)!r} (0x{op:02x}) at byte {i - 1} is not a plain value")
    raise UnsafePickleError("the pickle is truncated (no STOP instruction)")


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise UnsafePickleError(f"the pickle asks for {module}.{name}: only plain values are read")

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError("the pickle refers to a persistent object: only plain values are read")


def load_unscanned(data: bytes) -> Any:
    """The C unpickler with every import refused; the memo is not bounded (see the module docstring)."""
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except UnsafePickleError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError) as e:
        raise UnsafePickleError(f"not a readable pickle: {e or type(e).__name__}") from None


def loads(data: bytes) -> Any:
    """The plain values `data` pickles, or UnsafePickleError."""
    scan(data)
    return load_unscanned(data)
