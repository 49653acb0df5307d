# Parsl would submit this with: sbatch <script_dir>/parsl.mpi.block-0.<time>
#!/bin/bash

#SBATCH --job-name=parsl.mpi.block-0.<time>
#SBATCH --output=<script_dir>/parsl.mpi.block-0.<time>.stdout
#SBATCH --error=<script_dir>/parsl.mpi.block-0.<time>.stderr
#SBATCH --nodes=2
#SBATCH --time=60
#SBATCH --ntasks-per-node=1
#SBATCH --network=disable_rdzv_get
#SBATCH --exclusive
#SBATCH --partition=batch
#SBATCH --account=MyProj


export PARSL_TORCH_BLOCK_END="${SLURM_JOB_END_TIME:-$(( $(date +%s) + 3600 ))}" PARSL_TORCH_GRACE=180
module load PrgEnv-gnu rocm rccl-net-plugin craype-accel-amd-gfx90a; source <python_env>/bin/activate
export NCCL_SOCKET_IFNAME=hsn0
export MIOPEN_USER_DB_PATH=/tmp/miopen-cache
export MIOPEN_CUSTOM_CACHE_DIR=/tmp/miopen-cache


export JOBNAME="parsl.mpi.block-0.<time>"

process_worker_pool.py ...  # filled in by Parsl when it submits
