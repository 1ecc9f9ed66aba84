"""The pieces of a task: what the programs (``hpctrain/programs/``) build a task's story from.

Pure functions over an environment mapping (``task_env.py``, ``rank_plan.py``, ``master.py``), the
task's context (``context.py``), its process group, stop handling (``stop.py``, ``stop_signals.py``),
heartbeats and the hang watchdog, the reaper (``cleanup.py``), how a failure or a requeue is read
(``failures.py``, ``requeue.py``, ``slurm_relay.py``) and the summary (``run_summary.py``); a
``script:`` job's own pieces are in ``script/``.

A piece imports ``contract/``, ``jobspec/`` and other pieces, never a program, ``healing/`` or
``trainer/`` (tests/unit/test_house_layering.py): those stand above it and call it. The trainer,
the task API and healing import pieces; the login side only what ``launch/`` needs to render a job.
"""
