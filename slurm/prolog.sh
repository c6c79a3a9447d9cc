#!/usr/bin/env bash
# Example Slurm Prolog: refuse a job whose GPUs gpu-triage finds unhealthy.
#
# slurmd runs the Prolog as root before a job starts on the node. This one asks the local gpu-triage daemon
# for its verdict and fails (exit 1) when a GPU given to the job is unhealthy (`gpu-triage check` CRITICAL
# on that GPU). Slurm then requeues the job and drains the node with the reason "Prolog error"; the job's
# log and slurmd's log say which GPU and why. GPUs not given to the job, a degraded GPU, and a daemon that
# does not answer never refuse a job: the health check (gpu-triage-healthcheck) handles the node as a whole.
#
# The job's GPUs: SLURM_JOB_GPUS (Slurm's GPU ids), else CUDA_VISIBLE_DEVICES. Ids are matched against the
# NVML index (nvidia-smi's index), or the GPU UUID for a "GPU-..." id. With gres.conf AutoDetect=nvml Slurm
# numbers GPUs as NVML does; with hand-written File=/dev/nvidia[0-7] lines the ids are device minor
# numbers, which match the NVML index on most nodes (check: nvidia-smi -q | grep -E 'Minor Number|Bus Id').
# MIG devices are not matched (their parent GPU's verdict still drains the node through the health check).
#
# Merge these lines into your own Prolog if you have one. Settings: GPU_TRIAGE_BIN, GPU_TRIAGE_URL,
# GPU_TRIAGE_PYTHON and GPU_TRIAGE_CHECK_TIMEOUT, as for gpu-triage-healthcheck (the timeout defaults to 10 s
# here: the job waits for it).

set -u

gpus=${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-}}
if [ -z "$gpus" ] || [ "$gpus" = NoDevFiles ]; then
    exit 0  # a job without GPUs: nothing for gpu-triage to say
fi

gpu_triage=${GPU_TRIAGE_BIN:-gpu-triage}
python=${GPU_TRIAGE_PYTHON:-python3}
check_timeout=${GPU_TRIAGE_CHECK_TIMEOUT:-10}
check_args=(check --json --timeout "$(((check_timeout + 1) / 2))")
if [ -n "${GPU_TRIAGE_URL:-}" ]; then
    check_args+=(--url "$GPU_TRIAGE_URL")
fi

verdict_json=$(timeout -k 2 "$check_timeout" "$gpu_triage" "${check_args[@]}")
rc=$?
if [ $rc -ne 2 ]; then
    # 0 or 1: no GPU is unhealthy. 3, a timeout or a failure: no verdict, and no verdict refuses no job.
    exit 0
fi

# One line per unhealthy GPU among the job's: "GPU 3 (GPU-8f2c...): REBOOT_NODE Xid 79".
bad=$(printf '%s' "$verdict_json" | "$python" -c '
import json, sys

wanted = {g.strip() for g in sys.argv[1].split(",") if g.strip()}
d = json.loads(sys.stdin.read())
for gpu in d.get("gpus", []):
    ids = {str(gpu.get("gpu")), str(gpu.get("uuid"))}
    if gpu.get("health") != "unhealthy" or not ids & wanted:
        continue
    whys = [f for f in gpu.get("findings", []) if f.get("action") == gpu.get("action")][:1]
    why = ["Xid " + f["class"][4:] if f.get("class", "").startswith("xid_") else f.get("class", "") for f in whys]
    print("GPU %s (%s): %s" % (gpu.get("gpu"), gpu.get("uuid"), " ".join([gpu.get("action", "?")] + why)))
' "$gpus" 2>/dev/null) || exit 0

if [ -n "$bad" ]; then
    while IFS= read -r line; do
        echo "gpu-triage: job ${SLURM_JOB_ID:-?} refused on $(hostname -s): unhealthy $line" >&2
    done <<<"$bad"
    exit 1
fi
exit 0
