"""Log input as byte chunks for `diagnosis.training.diagnose`: files, stdin, HTTP bodies, gzip or not.

Also the one place the environment chooses the block scan diagnosis uses (`scan_engine`): diagnosis/
is given it as an argument and reads no process state itself.

Chunks stream: a multi-gigabyte log never sits in memory whole. Gzip is recognised by its magic bytes
(a .gz name is not needed, and a gzip file without one still works) and may hold several members, as
`cat a.gz b.gz` makes. Decompression of untrusted input is bounded, so a small gzip bomb stays small.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import BinaryIO

CHUNK_BYTES = 1 << 20
SCAN_ENV = "GPU_TRIAGE_SCAN"  # "python" forces the pure-Python scan, "hyperscan" requires Hyperscan
_GZIP_MAGIC = b"\x1f\x8b"


class InputTooLargeError(Exception):
    """More (decompressed) input than the limit allows."""


def _gunzip(chunks: Iterable[bytes], limit: int | None) -> Iterator[bytes]:
    inflater = zlib.decompressobj(wbits=31)
    fed = False  # the current member has had input (a member may end exactly where a chunk does)
    total = 0
    carry = b""
    for chunk in chunks:
        data, carry = carry + chunk, b""
        while data:
            if not fed:
                if len(data) < len(_GZIP_MAGIC) and _GZIP_MAGIC.startswith(data):
                    carry = data  # the next member's magic bytes, split between chunks
                    break
                if not data.startswith(_GZIP_MAGIC):
                    return  # trailing garbage after the last member: ignore it, as gzip -d does
                fed = True
            # Never inflate more than a chunk's worth at once: memory stays bounded whatever the ratio.
            out = inflater.decompress(data, CHUNK_BYTES)
            total += len(out)
            if limit is not None and total > limit:
                raise InputTooLargeError(f"decompressed input is over the limit of {limit} bytes")
            if out:
                yield out
            data = inflater.unconsumed_tail
            if inflater.eof:  # another gzip member may follow
                data = inflater.unused_data + data
                inflater, fed = zlib.decompressobj(wbits=31), False
    tail = inflater.flush()
    if tail:
        yield tail
    if fed and not inflater.eof:
        raise EOFError("the gzip data is truncated")


def decoded(chunks: Iterable[bytes], limit: int | None = None) -> Iterator[bytes]:
    """`chunks` as plain bytes: gunzipped (within `limit`) if they start with gzip's magic bytes."""
    stream = iter(chunks)
    first = b""
    for chunk in stream:
        if chunk:
            first = chunk
            break
    if not first:
        return
    rest = _prepend(first, stream)
    if first.startswith(_GZIP_MAGIC):
        yield from _gunzip(rest, limit)
    else:
        yield from rest


def _prepend(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    yield first
    yield from rest


def scan_engine() -> str | None:
    """The block scan the user asked for (`engine=` of diagnosis.training.diagnose); None: the fastest."""
    return os.environ.get(SCAN_ENV) or None


def scan_in_parallel() -> bool:
    """Whether `gpu-triage diagnose` may give its scan a second thread: when this process may run on two
    CPUs or more and one of them is idle (a busy node's second thread only waits for its turn, and the
    handing over costs more than it saves). The daemon keeps to one per request, so that
    --diagnose.max-cpu counts all of it."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        busy = os.getloadavg()[0]
    except OSError:  # no load average: trust the count
        busy = 0.0
    return cpus >= 2 and busy <= cpus - 1


def read_chunks(f: BinaryIO, progress: Callable[[int], None] | None = None) -> Iterator[bytes]:
    """A file's bytes, a chunk at a time; `progress` gets the bytes read so far."""
    done = 0
    while chunk := f.read(CHUNK_BYTES):
        done += len(chunk)
        if progress is not None:
            progress(done)
        yield chunk
