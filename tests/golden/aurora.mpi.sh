# Parsl would submit this with: qsub  -q debug -A MyProj <script_dir>/parsl.mpi.block-0.<time>
#!/bin/bash

#PBS -S /bin/bash
#PBS -N parsl.mpi.block-0.<time>
#PBS -m n
#PBS -l walltime=01:00:00
#PBS -l select=2:ncpus=208
#PBS -o <script_dir>/parsl.mpi.block-0.<time>.stdout
#PBS -e <script_dir>/parsl.mpi.block-0.<time>.stderr
#PBS -l filesystems=home:flare

export PARSL_TORCH_BLOCK_END="$(( $(date +%s) + 3600 ))" PARSL_TORCH_GRACE=180
module load frameworks; source <python_env>/bin/activate; cd $PBS_O_WORKDIR
export TMPDIR=/tmp
export CCL_PROCESS_LAUNCHER=pmix
export CCL_ATL_TRANSPORT=mpi
export CCL_KVS_MODE=mpi
export FI_MR_CACHE_MONITOR=userfaultfd
export ZE_FLAT_DEVICE_HIERARCHY=FLAT

export JOBNAME="parsl.mpi.block-0.<time>"

process_worker_pool.py ...  # filled in by Parsl when it submits

