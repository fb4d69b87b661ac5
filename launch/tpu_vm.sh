#!/usr/bin/env bash
# Runs Stage 1 on every worker of a Cloud TPU VM pod slice.
#
#   launch/tpu_vm.sh TPU_NAME ZONE [extra --config.* flags...]
#
# Every worker runs the same command; JAX detects the pod (jax.distributed needs no
# flags on TPU VMs), each worker feeds its slice of the global batch, and process 0
# writes logs and metrics. The workdir must be storage every worker sees (a gs://
# bucket for orbax checkpoints, or a shared filesystem), e.g.
#   --config.workdir=gs://my-bucket/convfit/stage1
# Environment: REPO_DIR (checkout on the workers, default ~/convfit_jax),
# PYTHON (default python3), CONFIG (default configs/stage1.py), PROJECT (gcloud project).
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 TPU_NAME ZONE [--config.x=y ...]" >&2
  exit 2
fi
TPU_NAME="$1"; ZONE="$2"; shift 2
REPO_DIR="${REPO_DIR:-~/convfit_jax}"
PYTHON="${PYTHON:-python3}"
CONFIG="${CONFIG:-configs/stage1.py}"
PROJECT_FLAG=()
if [[ -n "${PROJECT:-}" ]]; then PROJECT_FLAG=(--project="${PROJECT}"); fi

# Quote the user's flags for the remote shell.
EXTRA=""
for arg in "$@"; do EXTRA+=" $(printf '%q' "$arg")"; done

gcloud compute tpus tpu-vm ssh "${TPU_NAME}" --zone="${ZONE}" "${PROJECT_FLAG[@]}" --worker=all \
  --command="cd ${REPO_DIR} && ${PYTHON} -m convfit_jax.main --config=${CONFIG}${EXTRA}"
