"""gpu-triage: the node daemon (everything that touches the machine or the network)."""

__version__ = "0.1.0"
