"""hpctrain's version: the package face re-exports it, and what records it (a run's ``run.json``) imports it
from here, so no module beneath the face imports the face."""

__version__ = "0.1.0"
