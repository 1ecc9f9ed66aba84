"""Healing: a job that keeps its allocation when a node dies, hangs or (later) sickens.

Its own wing, as torchtitan keeps fault tolerance apart: the trainer and the
task runtime never import it; the sbatch script of a job with
``resources.min_nodes`` or ``spare_nodes`` runs its batch step as
``python -m hpctrain.healing.supervisor`` (``launch/submission.py`` writes the
line). One decider answers "what now about this node":

* ``supervisor.py`` runs each training step with ``srun --overlap`` on the
  chosen nodes and watches it;
* ``evidence.py`` gathers what a failed step shows (srun's reports,
  heartbeats, the hang report, slurmd and Slurm's node states);
* ``decide.py`` (pure) blames a node and decides: continue on the others (a
  spare first), requeue without it, or stop;
* ``record.py`` writes it down (summary.json's node failures, the
  supervisor's record) and requeues with ``ExcNodeList``;
* ``guardian.py`` watches the batch node itself from another node.

How a spec shrinks to fewer nodes is the spec's own rule
(``jobspec/node_loss.py``: ``step_spec``, ``STEP_NODES_VAR``), read by every task.
"""
