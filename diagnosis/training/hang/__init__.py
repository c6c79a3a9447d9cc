"""Hung jobs: Flight Recorder dumps and NCCL RAS output matched across ranks."""
