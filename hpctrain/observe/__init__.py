"""Looking at runs: status, the live view, reports."""
