"""The node's verdict: kernel-log XIDs and telemetry, put in context by the XID catalog, judged per GPU and per node."""
