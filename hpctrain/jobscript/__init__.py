"""The job script Slurm receives, written from a spec: pure and torch-free, on the login side.

* ``parameters.py``: spec -> submitit's executor parameters (``slurm_parameters``),
  and a healing job's batch-step supervisor command.
* ``sbatch_script.py``: those parameters -> the sbatch script's text, in
  submitit's layout (what ``submit --dry-run`` prints is what is submitted).
* ``templates.py``: the files in ``templates/`` (the shell preamble and the
  container's Slurm relay the script carries; the spec templates ``hpctrain
  init`` fills).

``launch/`` submits the job written here and ``planning/`` asks Slurm about
it (``sbatch --test-only``): both stand on this package, which imports
neither.
"""
