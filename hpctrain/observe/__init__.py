"""Looking at runs: the status rule, a study's points, logs, the live view and watch, reports."""
