"""Healing: a job that keeps its allocation when a node dies, hangs or sickens.

Its own wing, as torchtitan keeps fault tolerance apart: the trainer never
imports it, and the task launcher (``programs/launcher.py``) only ``burn_in.run_burn_in`` (the probes run
inside the training step, before the trainer); a script's wrapper runs them in
a child of its own before the script (``script_burn_in.py``). The sbatch script of a job
with ``resources.min_nodes`` or ``spare_nodes`` runs its batch step as
``python -m hpctrain.healing.supervisor`` (``launch/submission.py`` writes the
line). One decider answers "what now about this node" (keep, swap for a
spare, drop, requeue without it, fail), whatever the cause:

* ``supervisor.py`` runs each training step with ``srun --overlap`` on the
  chosen nodes and watches it: lost nodes, the burn-in's verdict, slow nodes;
* ``evidence.py`` gathers what a failed step shows (srun's reports,
  heartbeats, the hang report, slurmd and Slurm's node states);
* ``decide.py`` (pure) blames a node and answers every node question (the
  first start, a lost node, the batch node's loss, the burn-in's verdict, a
  slow node, a crash loop): one ``Situation`` in, one ``Decision`` out;
* ``record.py`` builds the situation from the run's record and is the one
  executor (``HealRecord.carry_out``): summary.json's node events, the user's
  bad-node ledger, the log line, then the requeue with ``ExcNodeList`` or the
  run failed;
* ``guardian.py`` watches the batch node itself from another node;
* ``burn_in.py``, ``probes.py`` (task side, torch) and ``scores.py`` (pure):
  the burn-in before every multi-node step; ``script_burn_in.py`` runs it
  before a ``script:`` job's script;
* ``eviction.py`` (pure): which node stays slower than the others.

How a spec shrinks to fewer nodes is the spec's own rule
(``jobspec/node_loss.py``: ``step_spec``, ``STEP_NODES_VAR``), read by every task;
the variables between the supervisor and the burn-in are ``jobspec/node_health.py``'s.
"""
