"""From a job spec to a submitted job: sbatch script, submission, studies, code snapshots."""
