#!/usr/bin/env bash
# Example Slurm Epilog: run gpu-triage's health check as soon as a job ends.
#
# A job that ends because its GPU failed (an Xid 79 kills it) should not wait up to a HealthCheckInterval
# before the node is drained: the next job would land on the broken GPU. So the Epilog runs the same
# health check, which drains the node with a "gpu-triage: ..." reason on a CRITICAL verdict (and resumes
# nodes it drained itself once they are healthy).
#
# It always exits 0: a failing Epilog makes Slurm drain the node with "Epilog error", which is a decision
# this script leaves to the health check. Merge these lines into your own Epilog if you have one.

"${GPU_TRIAGE_HEALTHCHECK:-/usr/local/sbin/gpu-triage-healthcheck}" || true
exit 0
