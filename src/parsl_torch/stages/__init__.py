"""Layer 5, submitted from the workflow process, run inside the ranks. Built-in stages: train
and evaluate the package's models, configured by YAML files in configs/. Each is a distributed app (``train``, ``evaluate``)
and a module entry point (``python -m parsl_torch.stages.train --config ...``)
for mpiexec, srun or Globus Compute."""
