"""nvmlDeviceGetFieldValues for the NVML backend: one driver call for many fields, each with its own return code.

A request (`FieldRequest`) is made once and asked at every poll. Through the real pynvml the answer is read
from plain ctypes structures and decoded in bulk, a C call for every field's type and code and one for every
value, each read as its type says (what `field_number` reads through pynvml's structures, field by field). A
request answers with the same types and codes poll after poll, so how to read them is worked out once. Where
pynvml's function has been substituted (the tests' fake) or the bytes are not laid out as this reads them,
every field goes through pynvml's own structures instead. query.py applies the error policy to the codes.
"""

from __future__ import annotations

import ctypes
import functools
import operator
import struct
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import pynvml

_SUCCESS = pynvml.NVML_SUCCESS
_ANSWERED_DOUBLE = (pynvml.NVML_VALUE_TYPE_DOUBLE, _SUCCESS)


class _FieldValue(ctypes.Structure):
    """nvmlFieldValue_t as pynvml declares it, without the attribute hooks of pynvml's own structure (which
    turn every member read into several Python calls: the per-field cost of a poll)."""

    _fields_ = pynvml.c_nvmlFieldValue_t._fields_


class FieldRequest:
    """Field values to ask for, scope by scope, and the names their failures are reported under; made once."""

    __slots__ = ("_array", "_hash", "_raw", "ids", "last", "names")

    def __init__(self, ids: Sequence[tuple[int, int]], names: Sequence[str]) -> None:
        self.ids, self.names = tuple(ids), tuple(names)
        if len(self.ids) != len(self.names):
            raise ValueError(f"{len(self.ids)} field ids and {len(self.names)} names")
        self._array = _FieldValue * len(self.ids)
        # The request's bytes: field and scope ids, the rest zero.
        self._raw = bytes(self._array(*(_FieldValue(field, scope) for field, scope in self.ids)))
        self._hash = hash((self.ids, self.names))
        self.last: tuple[tuple[int, ...], _Layout] | None = None  # the types and codes of the last answer

    def __len__(self) -> int:
        return len(self.ids)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FieldRequest) and (self.ids, self.names) == (other.ids, other.names)

    def __hash__(self) -> int:
        return self._hash

    def records(self) -> ctypes.Array[_FieldValue]:
        """A fresh array of the request's records, for the library to answer in."""
        return self._array.from_buffer_copy(self._raw)


class Answers(NamedTuple):
    """nvmlDeviceGetFieldValues' answer, field by field."""

    codes: tuple[int, ...]  # each field's return code
    numbers: list[int | float | None]  # its value (an int, a float for a double), None unless it answered
    doubles: tuple[int, ...]  # the positions of the fields that answered a double
    answered_all: bool  # every field answered


FieldValues = Callable[[Any, FieldRequest], Answers]
_REAL_FIELD_VALUES = pynvml.nvmlDeviceGetFieldValues
_VALUE_MEMBER = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


def field_number(fv: Any) -> int | float:
    """The number in a c_nvmlFieldValue_t, read by its value type: an int, or a float for a double."""
    number: int | float = getattr(fv.value, _VALUE_MEMBER.get(fv.valueType, "ullVal"))
    return number


def field_values() -> FieldValues:
    """nvmlDeviceGetFieldValues as each field's return code and value; through plain structures, decoded in
    bulk, unless pynvml's function has been substituted."""
    plain = _DECODABLE and pynvml.nvmlDeviceGetFieldValues is _REAL_FIELD_VALUES
    return plain_field_values if plain else through_pynvml


def through_pynvml(handle: Any, request: FieldRequest) -> Answers:
    values = pynvml.nvmlDeviceGetFieldValues(handle, list(request.ids))
    codes = tuple(int(fv.nvmlReturn) for fv in values)
    numbers = [field_number(fv) if code == _SUCCESS else None for fv, code in zip(values, codes, strict=True)]
    doubles = tuple(i for i, fv in enumerate(values) if (fv.valueType, fv.nvmlReturn) == _ANSWERED_DOUBLE)
    return Answers(codes, numbers, doubles, codes.count(_SUCCESS) == len(codes))


def plain_field_values(handle: Any, request: FieldRequest) -> Answers:
    records = request.records()
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
    pynvml._nvmlCheckReturn(fn(handle, ctypes.c_int32(len(request)), ctypes.byref(records)))
    return decode(bytes(records), request)


# A field value's record, as the library wrote it: valueType and nvmlReturn at bytes 24-31, the value's 8 bytes
# (a union) at 32-39. Native byte order and standard sizes, no padding: the layout of nvmlFieldValue_t (checked
# at import below). The value is read by its type, as field_number reads it: a narrower member is the union's
# first bytes (little-endian), and any other type is read as ullVal.
_HEAD = "24xII8x"
_RECORD = struct.calcsize("=" + _HEAD)
_VALUE_FORMAT = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "32xd",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "32xI4x",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "32xQ" if ctypes.sizeof(ctypes.c_ulong) == 8 else "32xI4x",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "32xQ",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "32xq",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "32xi4x",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "32xH6x",
}
# Read so only where the bytes are as this reads them; elsewhere every field goes through pynvml's structures.
_DECODABLE = sys.byteorder == "little" and ctypes.sizeof(_FieldValue) == _RECORD


@functools.lru_cache(maxsize=64)
def _heads(count: int) -> struct.Struct:
    """The type and return code of `count` records, read in one C call."""
    return struct.Struct("=" + _HEAD * count)


@dataclass(frozen=True, slots=True)
class _Layout:
    """How an answer whose records have these types and return codes is read."""

    codes: tuple[int, ...]
    values: struct.Struct  # every record's value, each read as its type says, in one C call
    doubles: tuple[int, ...]
    gather: Callable[[tuple[Any, ...]], Sequence[Any]] | None  # None where a field did not answer; None: all did


@functools.lru_cache(maxsize=256)
def _layout(heads: tuple[int, ...]) -> _Layout:
    """Worked out once per (types, return codes), for the requests whose answer's types or codes changed."""
    kinds, codes = heads[0::2], heads[1::2]
    values = struct.Struct("=" + "".join(_VALUE_FORMAT.get(kind, "32xQ") for kind in kinds))
    doubles = tuple(i for i, head in enumerate(zip(kinds, codes, strict=True)) if head == _ANSWERED_DOUBLE)
    if codes.count(_SUCCESS) == len(codes):
        return _Layout(codes, values, doubles, None)
    # Each field's value, or the None appended after the last: one C call, not a Python step per field.
    picks = [i if code == _SUCCESS else len(codes) for i, code in enumerate(codes)]
    gather = operator.itemgetter(*picks) if len(picks) > 1 else lambda numbers: (numbers[picks[0]],)
    return _Layout(codes, values, doubles, gather)


def decode(raw: bytes, request: FieldRequest | None = None) -> Answers:
    """The return code and the value (None unless it answered) of each nvmlFieldValue_t in `raw`: what
    field_number reads, field by field. With the request, its last answer's layout is tried first."""
    heads = _heads(len(raw) // _RECORD).unpack(raw)
    last = None if request is None else request.last
    if last is not None and last[0] == heads:
        layout = last[1]
    else:
        layout = _layout(heads)
        if request is not None:
            request.last = (heads, layout)
    numbers = layout.values.unpack(raw)
    if layout.gather is None:
        return Answers(layout.codes, list(numbers), layout.doubles, True)
    return Answers(layout.codes, list(layout.gather((*numbers, None))), layout.doubles, False)
