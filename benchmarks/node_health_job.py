"""The benchmark's entry point (benchmarks/node_health.py): the burn-in's probes, again and again, in one job.

``repeat_burn_in`` runs ``healing.burn_in.probe`` (every rank probes, rank 0
scores) ``repeats`` times in a row and rank 0 appends each verdict to
``RUN_DIR/bench-burn-in.jsonl``; nothing acts on it. One job start (4 ranks
importing torch on 2 cores: a minute) then serves ten measurements.
"""

from __future__ import annotations

import json
from typing import Any


def repeat_burn_in(ctx: Any, repeats: int = 10) -> dict[str, Any]:
    """The probes as a training run's burn-in runs them: its compute probe is the run's model, not the
    matrix product an entry point gets."""
    import copy

    from hpctrain.healing.burn_in import probe
    from hpctrain.healing.probes import TorchGroup, TorchKit

    ctx = copy.copy(ctx)
    ctx.spec = ctx.spec.model_copy(update={"entrypoint": None})
    flagged = 0
    for _ in range(repeats):
        kit = TorchKit(ctx)
        try:
            record = probe(ctx, TorchGroup(), kit)
        finally:
            kit.close()
        flagged += bool(record.flagged)
        if ctx.env.is_main:
            with open(ctx.run_dir / "bench-burn-in.jsonl", "a") as out:
                out.write(json.dumps(record.model_dump(mode="json")) + "\n")
    return {"repeats": repeats, "flagged": flagged}
