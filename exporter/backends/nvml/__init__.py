"""The NVML backend: telemetry, MIG, GPM profiling and XID events through pynvml (backend.py).

Nothing is imported here, so that what needs one piece (the release request's files, release.py)
does not load pynvml and the whole backend with it.
"""
