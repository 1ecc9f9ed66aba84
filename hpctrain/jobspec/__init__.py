"""The YAML job spec: one module per section, the assembled ``JobSpec``, loading, cluster profiles.

Charter. Torch-free: every login-node command reads it. The layers, bottom up
(a module imports only from layers below it, so the package has no circle):

1. ``section.py`` (the ``Section`` base: unknown keys are errors), ``fields.py``
   (shared field types and patterns), ``slurm_time.py``, ``strategy_traits.py``, ``after_names.py``
   (the ``{after.NAME}`` placeholders' names).
2. One module per YAML section, each with the checks that need only that
   section (its field ranges and validators): ``resources.py``, ``trainer.py``
   (with the ps, pipeline and model_parallel settings), ``data.py``,
   ``distributed.py``, ``checkpoint.py``, ``signals.py``, ``script.py``,
   ``health.py``, ``container.py``, ``tracking.py``, ``after.py``; and ``batch.py`` (the global batch of a
   ``trainer:`` section).
3. ``models.py``: ``JobSpec`` assembles the sections, holds the job's own
   top-level keys (``name``, ``cluster``, ``sweep``, ``study``, ...) and the
   values derived from several sections (``world_size``, ``batch_layout``).
   It re-exports every section, so ``from hpctrain.jobspec.models import X``
   works for each of them.
4. Checks across sections, given a ``JobSpec``: ``node_loss.py``,
   ``node_health.py``, ``script_checks.py``, ``layer_split.py``, ``tracking_checks.py``, gathered by
   ``cross_checks.py``; and ``profiles.py`` (cluster profiles).
5. ``load.py``: YAML + ``--set`` + profile -> ``LoadedJob`` (with its sweep
   trials and study points, ``study_axes.py``), every problem reported at once.

Adding a section (``tracking:``, say):

1. Write ``hpctrain/jobspec/tracking.py`` with ``class Tracking(Section)``: a
   docstring (it becomes the section's description in ``hpctrain schema`` and
   docs/spec-reference.md), fields with units in their names and a
   ``description=`` each, defaults that keep today's behaviour, and its own
   validators. It imports only layer 1.
2. In ``models.py``, the one line in ``JobSpec`` (and its import):
   ``tracking: Tracking = Tracking()`` (or ``Tracking | None = None`` for a
   section that is off unless written); add the name to ``__all__`` if callers
   import it from there.
3. A check that needs other sections goes in its own module in layer 4 and is
   called from ``cross_checks.check_resolved``.
4. Tests in ``tests/unit/test_jobspec_tracking.py``; then run
   ``python tools/gen_spec_reference.py`` and commit docs/spec-reference.md.
"""
