"""hpctrain: distributed PyTorch training from a YAML file to a resumable Slurm run."""

__version__ = "0.1.0"
