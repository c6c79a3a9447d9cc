#!/usr/bin/env bash
# Example Slurm Prolog: refuse a job whose GPUs gpu-triage finds unhealthy.
#
# slurmd runs the Prolog as root before a job starts on the node. This one asks the local gpu-triage daemon
# for the verdict of the job's GPUs (`gpu-triage check --gpus ... --format json`, version 1) and fails
# (exit 1) when one of them is unhealthy (CRITICAL). Slurm then requeues the job and drains the node with the reason
# "Prolog error"; the job's log and slurmd's log say which GPU and why. GPUs not given to the job, a degraded GPU, and a daemon that
# does not answer never refuse a job: the health check (gpu-triage-healthcheck) handles the node as a whole.
#
# A daemon that answers but cannot read a source its verdict depends on (the kernel log, the driver's events,
# its journal: check's JSON says `"incomplete": true`) refuses the job too: it would not see the XID that
# kills it, so it cannot call the job's GPUs healthy. GPU_TRIAGE_ADMIT_INCOMPLETE=1 admits such jobs instead
# (a node where the daemon runs without the kernel log on purpose, say).
#
# The job's GPUs: SLURM_JOB_GPUS (Slurm's GPU ids), else CUDA_VISIBLE_DEVICES. Ids are matched against the
# NVML index (nvidia-smi's index), or the GPU UUID for a "GPU-..." id. With gres.conf AutoDetect=nvml Slurm
# numbers GPUs as NVML does; with hand-written File=/dev/nvidia[0-7] lines the ids are device minor
# numbers, which match the NVML index on most nodes (check: nvidia-smi -q | grep -E 'Minor Number|Bus Id').
# MIG devices ("MIG-..." ids) are left out (their parent GPU's verdict still drains the node through the
# health check).
#
# Merge these lines into your own Prolog if you have one. Settings: GPU_TRIAGE_BIN, GPU_TRIAGE_URL and
# GPU_TRIAGE_CHECK_TIMEOUT, as for gpu-triage-healthcheck (the timeout defaults to 10 s here: the job waits
# for it).

set -u

ids=${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-}}
gpus=""
IFS=, read -ra list <<<"$ids"
for id in "${list[@]}"; do
    case $id in "" | NoDevFiles | MIG-*) ;; *) gpus=${gpus:+$gpus,}$id ;; esac
done
if [ -z "$gpus" ]; then
    exit 0 # a job without GPUs (or with MIG devices only): nothing for gpu-triage to say here
fi

gpu_triage=${GPU_TRIAGE_BIN:-gpu-triage}
check_timeout=${GPU_TRIAGE_CHECK_TIMEOUT:-10}
check_args=(check --gpus "$gpus" --format json --timeout "$(((check_timeout + 1) / 2))")
if [ -n "${GPU_TRIAGE_URL:-}" ]; then
    check_args+=(--url "$GPU_TRIAGE_URL")
fi

answer=$(timeout -k 2 "$check_timeout" "$gpu_triage" "${check_args[@]}")
rc=$?
# Version 1 of check's JSON: each top-level key on a line of its own, two spaces in (as in
# gpu-triage-healthcheck).
field() {
    printf '%s\n' "$answer" | sed -n "s/^  \"$1\": \(.*\)\$/\1/p" | head -n 1 | sed 's/,$//; s/^"\(.*\)"$/\1/'
}
if [ "$(field version)" != 1 ] || [ "$(field exit_code)" != "$rc" ]; then
    exit 0 # no verdict (check failed to run, timed out, or answered what this script cannot read) refuses no job
fi
# One line, e.g. "REBOOT_NODE: GPU 3 Xid 79 job 4242": what the job's GPUs need, and why.
why=$(field reason)
case $(field status) in
CRITICAL) ;;
UNKNOWN)
    # No verdict (or a GPU id this node does not have) refuses no job; an incomplete one does.
    if [ "$(field incomplete)" != true ] || [ "${GPU_TRIAGE_ADMIT_INCOMPLETE:-0}" = 1 ]; then
        exit 0
    fi
    echo "gpu-triage: job ${SLURM_JOB_ID:-?} refused on $(hostname -s): the verdict is incomplete: $why" >&2
    exit 1
    ;;
*) exit 0 ;; # OK or WARNING: no GPU of the job's is unhealthy
esac
echo "gpu-triage: job ${SLURM_JOB_ID:-?} refused on $(hostname -s): $why" >&2
exit 1
