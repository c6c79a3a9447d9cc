"""Does a DCGM host engine on this node already profile the GPUs? Asked before NVML turns GPM on.

Two profilers at once is what gpu-triage never does: on GPUs before Hopper they fight over the
same hardware, and even where they would not, one of them is enough. A field that nobody watches
reads as DCGM_ST_NOT_WATCHED; one that a client of the host engine (dcgm-exporter, say) watches
has a recent value. The check connects, reads SM activity of each GPU without watching it, and
disconnects. Anything that goes wrong means "no": no host engine, no bindings, no answer.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from gpu_triage.exporter.backends.dcgm import bindings, fields
from gpu_triage.exporter.backends.dcgm.address import Address, unreachable
from gpu_triage.exporter.backends.dcgm.connection import CONNECT_TIMEOUT_MS, initialise

log = logging.getLogger(__name__)
FRESH_SECONDS = 600.0  # a value older than this is a watch someone has since dropped


def profiling_watched(address: Address, bindings_dir: Path | None = None) -> str | None:
    """Who profiles ("the DCGM host engine at … watches …"), or None when nobody does, or we cannot tell."""
    if unreachable(address) is not None or bindings.find(bindings_dir) is None:
        return None
    try:
        b = bindings.load(bindings_dir)
        initialise(b)
        target, unix = address.for_dcgm()
        handle = b.agent.dcgmConnect_v2(target, b.connect_params(timeout_ms=CONNECT_TIMEOUT_MS, unix_socket=unix))
    except Exception as e:  # any failure: we cannot tell, so GPM may run
        log.info("could not ask the DCGM host engine whether it profiles", extra={"error": repr(e)})
        return None
    try:
        ids = list(b.agent.dcgmGetAllSupportedDevices(handle))
        pairs = [b.structs.c_dcgmGroupEntityPair_t(fields.FE_GPU, i) for i in ids]
        values = b.agent.dcgmEntitiesGetLatestValues(handle, pairs, [fields.PROF_SM_ACTIVE], 0) if pairs else []
        now_us = time.time() * 1e6
        for fv in values:
            if fv.status == fields.ST_OK and now_us - fv.ts < FRESH_SECONDS * 1e6:
                return f"the DCGM host engine at {address} watches the profiling fields (DCGM GPU {fv.entityId})"
        return None
    except Exception as e:
        log.info("could not ask the DCGM host engine whether it profiles", extra={"error": repr(e)})
        return None
    finally:
        try:
            b.agent.dcgmDisconnect(handle)
        except Exception as e:
            log.debug("disconnect failed", extra={"error": repr(e)})
