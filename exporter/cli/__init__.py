"""The `gpu-triage` command line and its one-shot commands."""
