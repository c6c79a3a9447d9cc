"""gpu-triage: NVIDIA GPU telemetry for Prometheus, XID and training-log diagnosis, remediation playbooks.

The repository keeps the product's top-level folders (exporter/, diagnosis/, alerts/, dashboards/,
systemd/); this package gathers them under one import name, so an installed gpu-triage adds
`gpu_triage` to site-packages and nothing else.
"""

__version__ = "0.1.0"
