"""gpu-triage diagnosis: pure logic and the data it runs on (no I/O, time passed in)."""
