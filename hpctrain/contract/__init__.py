"""The run's contract: what the login side and the tasks both read and write (torch-free)."""
