"""Time to result: when a run would start, how long it would train, and which shape finishes first.

``hpctrain plan SPEC --nodes 1,2,4,8`` and ``hpctrain.plan(...)`` call
:func:`hpctrain.planning.plan.plan`. The package reads; it never submits by
itself, writes or imports torch (login side), and it stands beneath
``launch/`` (whose submit records a forecast made here): what it asks Slurm
about is ``jobscript/``'s job. Its parts, in the order a plan is made:

* ``work.py``: the work in optimizer steps at each shape (epochs x steps per
  epoch), and where the step count came from -- or what is missing.
* ``history.py``: this spec's earlier runs and study points (same model,
  batch, precision, data), read through ``contract/``'s bounded readers:
  measured step times per node count, the samples of an epoch.
* ``step_time.py``: the step time at each shape from the best source, named:
  measured, the report's what-if model over earlier runs' ``step_split``
  records (``contract/scaling_model.py``) or else a fitted scaling model
  (both extrapolated), or the user's number.
* ``measure.py``: ``--measure``, a short run of the spec through the submit
  sequence that the faces hand down (``launch.submit.submit``).
* ``cluster.py``: what Slurm says -- the partition's limits and
  ``sbatch --test-only``'s start, through the one client.
* ``timeline.py``: chunks (time limit), each chunk's queue wait and restart,
  finish, node- and GPU-hours, and the recommendation with its reason. Pure.
* ``plan.py``: the sequence, and the :class:`~hpctrain.planning.plan.Plan`
  both faces show.

What no part can know (other users' future jobs, a node lost mid-run) is
said in the plan's notes and in docs/planning.md, never filled in.
"""
