#!/usr/bin/env bash
# Example Slurm Epilog: when a job's ranks left Flight Recorder dumps (the job hung or timed out), gather
# them with the node's kernel log and the job's output into one folder and let gpu-triage name the rank
# that hung, and why.
#
# The job writes its dumps into a spool folder per job on each node, which this script finds by the job id:
#
#     mkdir -p /tmp/gpu-triage-fr/$SLURM_JOB_ID            # in the batch script, before srun/torchrun
#     export TORCH_NCCL_DUMP_ON_TIMEOUT=1 TORCH_NCCL_DEBUG_INFO_TEMP_FILE=/tmp/gpu-triage-fr/$SLURM_JOB_ID/nccl_trace_rank_
#
# (a Gloo job's timeout handler writes `torch._C._distributed_c10d._dump_fr_trace()` to the same prefix
# plus its rank). slurmd runs the Epilog as root on every node of the job once it ends. Each node copies
# its dumps and its kernel log since the job started into GPU_TRIAGE_FR_DIR/<job>/files/<node>/ (put
# GPU_TRIAGE_FR_DIR on shared storage for a job of several nodes), the job's output file where this node
# can read it, then runs `gpu-triage diagnose` over the whole files/ folder: each node's epilog sees what
# the nodes before it copied, so the report of the last one covers the job. The report is
# GPU_TRIAGE_FR_DIR/<job>/report.txt (and report.json); its first line, a ticket title, goes to syslog:
#
#     gpu-triage: job 4242: Root cause: Rank 3 never entered all_reduce #5 of process group 0 (default_pg); ...
#
# A hang does not drain the node: when the culprit's GPU logged an XID, the report puts the XID first and
# the health check (epilog.sh) drains the node for it. The script always exits 0 (a failing Epilog makes
# Slurm drain the node as "Epilog error"). Settings, from the environment: GPU_TRIAGE_FR_SPOOL
# (/tmp/gpu-triage-fr), GPU_TRIAGE_FR_DIR (/var/log/gpu-triage/jobs), GPU_TRIAGE_BIN (gpu-triage),
# GPU_TRIAGE_DIAGNOSE_TIMEOUT (120 s), SCONTROL, SCONTROL_TIMEOUT (20 s), JOURNALCTL, LOGGER.

set -u

job=${SLURM_JOB_ID:-}
case $job in "" | *[!0-9A-Za-z_]*) exit 0 ;; esac
spool=${GPU_TRIAGE_FR_SPOOL:-/tmp/gpu-triage-fr}/$job
root=${GPU_TRIAGE_FR_DIR:-/var/log/gpu-triage/jobs}
bin=${GPU_TRIAGE_BIN:-gpu-triage}
scontrol=${SCONTROL:-scontrol}
journalctl=${JOURNALCTL:-journalctl}
logger=${LOGGER:-logger}
node=${SLURMD_NODENAME:-$(hostname -s)}

shopt -s nullglob
dumps=("$spool"/*)
if [ ${#dumps[@]} -eq 0 ]; then
    exit 0 # no dump: the job did not hang (or did not record)
fi
files=$root/$job/files
mine=$files/$node
(umask 027 && mkdir -p "$mine") || exit 0
cp -p -- "${dumps[@]}" "$mine/" 2>/dev/null

info=$(timeout "${SCONTROL_TIMEOUT:-20}" "$scontrol" show job -o "$job" 2>/dev/null)
start=$(grep -o 'StartTime=[^ ]*' <<<"$info" | cut -d= -f2)
case $start in [0-9][0-9][0-9][0-9]-*T*) since=${start/T/ } ;; *) since="2 hours ago" ;; esac
# The kernel's own lines: an XID on the culprit's GPU is the root cause of the hang.
timeout 30 "$journalctl" -k --no-pager -o short --since "$since" >"$mine/kernel.log" 2>/dev/null || rm -f -- "$mine/kernel.log"
# The job's output (its ranks' logs, when they print to it), read where this node can: the last 256 MiB.
for key in StdOut StdErr; do
    out=$(grep -o "$key=[^ ]*" <<<"$info" | cut -d= -f2-)
    if [ -n "$out" ] && [ -f "$out" ] && [ -r "$out" ] && [ ! -e "$files/job-$key.log" ]; then
        tail -c $((256 << 20)) -- "$out" >"$files/job-$key.log" 2>/dev/null
    fi
done

report=$root/$job/report
(
    flock -w 60 9 || exit 0
    timeout "${GPU_TRIAGE_DIAGNOSE_TIMEOUT:-120}" "$bin" diagnose --json "$files" >"$report.json.tmp" 2>/dev/null
    timeout "${GPU_TRIAGE_DIAGNOSE_TIMEOUT:-120}" "$bin" diagnose "$files" >"$report.txt.tmp" 2>&1
    mv -f -- "$report.json.tmp" "$report.json"
    mv -f -- "$report.txt.tmp" "$report.txt"
) 9>"$root/$job/.lock"

if [ -s "$report.txt" ]; then
    "$logger" -t gpu-triage -- "job $job: $(head -n 1 -- "$report.txt")" 2>/dev/null
fi
rm -rf -- "$spool"
exit 0
