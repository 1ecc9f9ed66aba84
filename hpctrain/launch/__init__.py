"""From a job spec to a submitted job (sbatch script, submission, studies, code snapshots), and controlling
jobs once submitted: following or waiting for them, cancel, resume, rehearsal."""
