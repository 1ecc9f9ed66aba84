"""The tracking wing: a run's curves in Weights & Biases and MLflow, read from the run directory.

Charter. This package is the only place that imports a tracker library
(``wandb``, ``mlflow``), and only inside the sink that sends there; the
trainer, the task API, script jobs and the launchers never import it or them
(tests/unit/test_house_layering.py). It **reads** the run-directory contract
(``metrics.jsonl``, ``summary.json``, ``run.json``, ``spec.yaml``, the
checkpoints' steps, ``report/``) on the login side, torch-free, and writes
only what the contract gives it: the sync cursors (``contract/tracking_state.py``)
and the W&B offline run folder (``RUN/wandb/``).

* ``plan.py``: what to send, pure: the last value of each settled step,
  restarts, lost nodes, evictions, the run's facts as tags, the spec as
  parameters.
* ``sync.py``: the one sequence of ``hpctrain sync`` (CLI and API): per run,
  per tracker, send what is new and move the cursor after the tracker
  acknowledged.
* ``mlflow_sink.py``, ``wandb_sink.py``: one tracker each.

The spec section is ``jobspec/tracking.py``; the user's guide docs/tracking.md.
"""
