"""The pieces of a ``script:`` job's task: what the wrapper (``programs/script_launcher.py``) runs the script with.

A script job runs the user's own program under a wrapper that gives it hpctrain's guarantees (issue 27:
stop signals, heartbeats, requeue, a summary naming the process that failed). The data flows one way:

* ``command.py`` (pure): the placeholders, command line, environment and folder of each process;
  ``submit --dry-run`` prints them from the same functions;
* ``child.py``: the script as a process of the task, in a session of its own, stopped as a whole;
* ``outcome.py``: how a start ends (completed, stopped, the first process that failed), as the run
  directory records it;
* ``process.py``: the other side, inside the user's script: its stop signal and heartbeat thread
  (``hpctrain.task`` calls it; torch-free).

Like every piece of ``runtime/``, none imports a program, ``healing/`` or ``trainer/``.
"""
