"""gpu-triage: the node daemon (everything that touches the machine or the network)."""
