"""The DCGM backend: telemetry, profiling and health watches from a running DCGM host engine."""

from gpu_triage.exporter.backends.dcgm.address import Address
from gpu_triage.exporter.backends.dcgm.backend import DcgmBackend

__all__ = ["Address", "DcgmBackend"]
