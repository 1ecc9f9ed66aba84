"""The report's "where the time goes" section: the waterfall, the causes and the what-if, as text and JSON.

``explain(runs, rows)`` gathers each run's steady split (``waterfall.py``), the
bars, the causes and the predictions (``causes.py``); :func:`markdown_lines` and
:func:`html_section` draw them for report.md and report.html, ``as_dict`` is
what ``report --json`` carries under ``"waterfall"``.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hpctrain.contract.step_split import LABELS
from hpctrain.observe.report.causes import Cause, Prediction, causes, predict
from hpctrain.observe.report.links import LinkEvidence, latest_rates, slow_links
from hpctrain.observe.report.load import RunData
from hpctrain.observe.report.table import Row
from hpctrain.observe.report.waterfall import Bar, Split, count_text, run_split, waterfall

SHOWN_LOSS = 0.005  # losses below half a percent are left out of the one-line summaries
HEADER = ("scale", "kind", "actual step", "ideal step", "efficiency", "lost to")


@dataclass
class Explanation:
    splits: list[Split] = field(default_factory=list)
    bars: list[Bar] = field(default_factory=list)
    causes: list[Cause] = field(default_factory=list)
    predictions: list[Prediction] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "splits": [
                {
                    "label": s.label,
                    "devices": s.devices,
                    "ranks": s.ranks,
                    "step_s": s.step_s,
                    "parts_s": s.parts,
                    "windows": s.windows,
                    "slowest_rank": s.slowest_rank,
                    "slowest_node": s.slowest_node,
                    "slowest_windows": s.slowest_windows,
                    "slowest_chance": round(s.slowest_chance, 6),
                }
                for s in self.splits
            ],
            "bars": [b.as_dict() for b in self.bars],
            "causes": [c.as_dict() for c in self.causes],
            "predictions": [p.as_dict() for p in self.predictions],
        }


def _workers(run: RunData) -> int | None:
    data = run.spec.get("data")
    value = data.get("workers") if isinstance(data, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _log_every(run: RunData) -> int | None:
    trainer = run.spec.get("trainer")
    value = trainer.get("log_every_steps") if isinstance(trainer, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def explain(runs: list[RunData], rows: list[Row]) -> Explanation:
    splits = []
    links: dict[str, LinkEvidence] = {}
    for run, row in zip(runs, rows):
        split = run_split(
            run.label,
            run.splits,
            devices=row.devices,
            device_kind=row.device_kind,
            global_batch=row.global_batch,
            nodes_of_ranks=run.nodes,
            data_workers=_workers(run),
            log_every=_log_every(run),
        )
        if split is not None:
            splits.append(split)
            rates, compute = latest_rates(run.summary)
            link = slow_links(rates, set(run.nodes.values()) or None, compute)
            if link is not None:
                links[split.label] = link
    bars = waterfall(splits)
    return Explanation(splits, bars, causes(bars, splits, links), predict(splits))


def loss_name(part: str, bar: Bar, splits: list[Split], found: Sequence[Cause] = ()) -> str:
    link = next((c for c in found if c.part == "link" and c.where == bar.label), None)
    if part == "comm" and link is not None:
        return f"{LABELS['comm']} (slow link {', '.join(link.nodes)})"
    if part != "straggler":
        return LABELS.get(part, part)
    split = next((s for s in splits if s.devices == bar.devices), None)
    who = split and (split.slowest_node or (f"rank {split.slowest_rank}" if split.slowest_rank is not None else None))
    return f"straggler {who}" if who else "straggler wait"


def _shown(bar: Bar, splits: list[Split], found: Sequence[Cause]) -> list[str]:
    """``exposed communication 22 %`` for each loss of at least SHOWN_LOSS, largest first."""
    named = [(loss_name(x.part, bar, splits, found), x.fraction) for x in bar.losses if x.fraction >= SHOWN_LOSS]
    return [f"{name} {fraction * 100:.0f} %" for name, fraction in named]


def summary_line(bar: Bar, splits: list[Split], found: Sequence[Cause] = ()) -> str:
    """``4 processes: 65 % - data wait 4 %, exposed communication 22 %, straggler node3 7 %``."""
    shown = _shown(bar, splits, found)
    return f"{count_text(bar.devices, bar.device_kind)}: {bar.efficiency * 100:.0f} %" + (
        " - " + ", ".join(shown) if shown else ""
    )


def _cells(bar: Bar, splits: list[Split], found: Sequence[Cause] = ()) -> list[str]:
    shown = _shown(bar, splits, found)
    kind = "vs the smallest scale" if bar.kind == "scaling" else "vs its own compute"
    return [
        f"{count_text(bar.devices, bar.device_kind)} ({bar.label})",
        kind,
        f"{bar.actual_s * 1000:.1f} ms",
        f"{bar.ideal_s * 1000:.1f} ms",
        f"{bar.efficiency * 100:.0f} %",
        ", ".join(shown) or "-",
    ]


def _prediction_text(p: Prediction) -> str:
    return (
        f"{count_text(p.devices, p.device_kind)}: about {p.efficiency * 100:.0f} % efficiency; "
        f"{LABELS.get(p.dominant, p.dominant)} would lose the most ({p.dominant_loss * 100:.0f} % of the step); "
        f"{p.model}"
    )


CAPTION = (
    "Each rank laps a clock through every step; once per log window the ranks combine their sums "
    "(docs/scaling.md). Losses add up to 100 % minus the efficiency; a negative one is a part that shrank."
)


def markdown_lines(ex: Explanation, table: Any) -> list[str]:
    if not ex.bars:
        return []
    lines = ["## Where the step time goes", ""]
    scaling = [b for b in ex.bars if b.kind == "scaling"] or [b for b in ex.bars if b.kind == "step"]
    lines += [f"- {summary_line(b, ex.splits, ex.causes)}" for b in scaling] + [""]
    lines += [*table(list(HEADER), [_cells(b, ex.splits, ex.causes) for b in ex.bars]), "", f"_{CAPTION}_", ""]
    lines += ["### Causes", ""]
    lines += [f"- {c.text()}" for c in ex.causes] or ["- none: no part costs 10 % of the step or more"]
    if ex.predictions:
        lines += ["", "### What if", "", *(f"- {_prediction_text(p)}" for p in ex.predictions)]
    return [*lines, ""]


def html_section(ex: Explanation, table: Any) -> list[str]:
    if not ex.bars:
        return []
    scaling = [b for b in ex.bars if b.kind == "scaling"] or [b for b in ex.bars if b.kind == "step"]
    items = "".join(f"<li>{html.escape(summary_line(b, ex.splits, ex.causes))}</li>" for b in scaling)
    parts = ["<h2>Where the step time goes</h2>", f"<ul>{items}</ul>"]
    parts += [
        table(list(HEADER), [_cells(b, ex.splits, ex.causes) for b in ex.bars]),
        f'<p class="def">{html.escape(CAPTION)}</p>',
    ]
    found = "".join(f"<li>{html.escape(c.text())}</li>" for c in ex.causes)
    parts += ["<h3>Causes</h3>", f"<ul>{found or '<li>none: no part costs 10 % of the step or more</li>'}</ul>"]
    if ex.predictions:
        what_if = "".join(f"<li>{html.escape(_prediction_text(p))}</li>" for p in ex.predictions)
        parts += ["<h3>What if</h3>", f"<ul>{what_if}</ul>"]
    return parts
