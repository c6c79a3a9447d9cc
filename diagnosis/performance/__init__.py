"""Why a job is slow: rolling windows of telemetry judged by the performance rules."""
