#!/usr/bin/env bash
# Runs Stage 1 on a SLURM GPU cluster: one process per node, all GPUs of the node each.
#
#   sbatch --nodes=2 --gpus-per-node=8 launch/slurm.sh [extra --config.* flags...]
#   # or, inside an allocation:  srun --nodes=2 --ntasks-per-node=1 launch/slurm.sh ...
#
# The coordinator is the first node of the allocation; process count and id come
# from SLURM_NTASKS / SLURM_PROCID and are passed to jax.distributed through the
# config. The workdir must be on a filesystem every node sees. Environment: PYTHON (default python3), CONFIG (default
# configs/stage1.py), PORT (coordinator port, default 12355).
#SBATCH --job-name=convfit-stage1
#SBATCH --ntasks-per-node=1
#SBATCH --output=convfit-stage1-%j.out
set -euo pipefail

PYTHON="${PYTHON:-python3}"
CONFIG="${CONFIG:-configs/stage1.py}"
PORT="${PORT:-12355}"

if [[ -z "${SLURM_STEP_ID:-}" ]]; then
  # Called by sbatch: start one task per node running this same script.
  exec srun --ntasks-per-node=1 --kill-on-bad-exit=1 "$0" "$@"
fi

# Inside srun: name the coordinator explicitly so the port is under our control.
COORDINATOR="$(scontrol show hostnames "${SLURM_JOB_NODELIST}" | head -n 1):${PORT}"
exec "${PYTHON}" -m convfit_jax.main --config="${CONFIG}" \
  --config.distributed.coordinator_address="${COORDINATOR}" \
  --config.distributed.num_processes="${SLURM_NTASKS}" \
  --config.distributed.process_id="${SLURM_PROCID}" \
  "$@"
