"""``health:``: sick nodes, not only dead ones: the burn-in, slow-node eviction and the bad-node ledger.

Its checks across sections (eviction only where a node can go) are in
``node_health.py``; what the keys do is docs/node-health.md.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from hpctrain.jobspec.section import Section


class BurnIn(Section):
    """Probes at the start of every multi-node training step; a node worse than the others is taken out."""

    enabled: Annotated[
        bool,
        Field(
            description="Run the burn-in at the start of every training step on more than one node (first start, "
            "each requeue, each relaunch after a lost node; a script: before the script starts; launcher: "
            "torchrun: each node task before it starts torchrun); false: off (docs/node-health.md)."
        ),
    ] = True
    budget_s: Annotated[
        float,
        Field(ge=2, le=300, description="Upper bound on the probes' time, seconds (start-up not counted)."),
    ] = 20.0
    margin: Annotated[
        float,
        Field(
            ge=1.1,
            le=100,
            description="A node is flagged when its compute or read score is worse than the median of the other "
            "nodes' by this factor (and by mad_k robust deviations).",
        ),
    ] = 1.5
    network_margin: Annotated[
        float,
        Field(
            ge=1.1,
            le=100,
            description="The same factor for the pairwise all-reduce: link bandwidth varies more between healthy "
            "nodes than compute does (traffic of other jobs on shared switches), a degraded link is 2x or worse.",
        ),
    ] = 2.0
    mad_k: Annotated[
        float,
        Field(
            ge=1,
            le=1000,
            description="How many median absolute deviations (x 1.4826) of the other nodes a flagged score must "
            "also lie beyond.",
        ),
    ] = 6.0


class Eviction(Section):
    """A node that stays slower than the others during training is taken out, as a lost node is."""

    enabled: Annotated[
        bool | Literal["auto"],
        Field(
            description="auto: on when the job can go on without a node (resources.spare_nodes, or min_nodes < "
            "nodes); true asks for it (a spec error without either); false: off."
        ),
    ] = "auto"
    margin: Annotated[
        float,
        Field(
            ge=1.1,
            le=100,
            description="Slow: the node's median compute time (a step's own, or the forward) is more than this "
            "factor of the others'.",
        ),
    ] = 1.5
    window_s: Annotated[
        float,
        Field(ge=5, le=86400, description="How long a node must stay the slowest by the margin before it is evicted."),
    ] = 120.0
    min_steps: Annotated[
        int,
        Field(ge=1, le=100000, description="Steps each rank of a training step must have timed before any verdict."),
    ] = 10


class Health(Section):
    """Sick nodes, not only dead ones: burn-in, slow-node eviction, the bad-node ledger (docs/node-health.md)."""

    burn_in: Annotated[BurnIn, Field(description="Probes before training on every multi-node step.")] = BurnIn()
    eviction: Annotated[Eviction, Field(description="Slow-node eviction during training.")] = Eviction()
    ledger_days: Annotated[
        float,
        Field(
            ge=0,
            le=365,
            description="How long a node this run flags or loses stays in your bad-node ledger (submit excludes it; "
            "'hpctrain nodes'); 0: the run adds nothing to the ledger.",
        ),
    ] = 7.0
