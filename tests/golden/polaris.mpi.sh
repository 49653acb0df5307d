# Parsl would submit this with: qsub  -q debug -A MyProj <script_dir>/parsl.mpi.block-0.<time>
#!/bin/bash

#PBS -S /bin/bash
#PBS -N parsl.mpi.block-0.<time>
#PBS -m n
#PBS -l walltime=01:00:00
#PBS -l select=2:ncpus=64:ngpus=4
#PBS -o <script_dir>/parsl.mpi.block-0.<time>.stdout
#PBS -e <script_dir>/parsl.mpi.block-0.<time>.stderr
#PBS -l filesystems=home:eagle

export PARSL_TORCH_BLOCK_END="$(( $(date +%s) + 3600 ))" PARSL_TORCH_GRACE=180
module use /soft/modulefiles; module load conda; conda activate; source <python_env>/bin/activate; cd $PBS_O_WORKDIR
export TMPDIR=/tmp

export JOBNAME="parsl.mpi.block-0.<time>"

process_worker_pool.py ...  # filled in by Parsl when it submits

