"""The programs a task starts: the top of the task side, above ``runtime/``, ``healing/`` and ``trainer/``.

Each module here is a program: a callable submitit pickles on the login node and runs on every task,
or a ``python -m`` that torchrun starts for each rank. A program tells one task's story from its first
line to its last (stop signals, the task environment, the burn-in, the user's code or script, the
summary, the requeue) and takes every step from a piece beneath it; the pieces never import a program.

* ``launcher.py``: ``TaskLauncher``, a trainer or entry-point task (one per rank);
* ``torchrun_node.py``: ``TorchrunNodeLauncher``, one task per node that starts torchrun, whose
  ranks run ``torchrun_worker.py`` (a ``TaskLauncher`` under torchrun's variables);
* ``script_launcher.py``: ``ScriptLauncher``, the wrapper around a ``script:`` job's process
  (its pieces are ``runtime/script/``);
* ``script_torchrun.py``: ``ScriptTorchrunNode`` and each rank's wrapper under torchrun.

Who may import a program: ``launch/task_programs.py``, which builds it for submitit to pickle into
the job, and another program.
submitit pickles the class by its module path, so a program's module is part of every submitted
job: the package root (``hpctrain/__init__.py``) keeps the names they had before they came here
(issue 36), and a program that moves again must keep its old name there likewise.
Importing any program imports no torch.
"""
