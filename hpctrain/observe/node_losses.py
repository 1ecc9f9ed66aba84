"""One line each about what a run did about its nodes, for status, watch and report (summary.json's
``node_failures``, ``burn_in`` and ``evictions``, read typed by ``contract/node_records.py``).

The records come from a run directory, so they are untrusted: anything that
is not a record (an object naming its node) is skipped, a field of the wrong
type is left out of its line, only the last few are shown, and the text is
made printable. Torch-free.
"""

from __future__ import annotations

from typing import Any

from hpctrain.contract.node_records import BurnIn, Eviction, NodeEvent, records
from hpctrain.contract.runfiles import printable

SHOWN = 5  # the last records shown; older ones are counted
# What each decision (healing/decide.py) did, in the words a user reads; "continue" is an older run's word.
_DONE = {
    "swap": "swapped for a spare, training on",
    "drop": "dropped, training on",
    "keep": "kept, training on",
    "continue": "continue on",
    "requeue": "requeued without it",
    "fail": "the run stopped",
}
SCORES_SHOWN = 16  # nodes of one burn-in shown in a line


def node_loss_text(failures: Any) -> str | None:
    """``n2 at step 412 (rank 3 exited 137): swapped for a spare, training on n1,n3`` for each node
    decision (``n3 slow ...``, ``n4 burn-in ...`` for sick nodes), or None without any."""
    found = records(NodeEvent, failures)
    if not found:
        return None
    parts = [_one(event) for event in found[-SHOWN:]]
    older = len(found) - SHOWN
    return printable(("; ".join(parts)) + (f" (and {older} earlier)" if older > 0 else ""))


def _one(event: NodeEvent) -> str:
    at = f" at step {event.step}" if event.step is not None else ""
    kind = "" if event.kind == "lost" else f" {event.kind}"
    return f"{event.node}{kind}{at} ({event.reason}): {_done(event.action, event.nodes)}"


def _done(action: str, nodes: list[str]) -> str:
    """``swapped for a spare, training on n1,n3``: the decision and where the run went on."""
    words = _DONE.get(action, action)
    if words.endswith(" on"):
        return f"{words} {','.join(nodes[:64])}" if nodes else words[: -len(" on")].removesuffix(", training")
    return words


def burn_in_text(value: Any) -> str | None:
    """The last burn-in: ``3.1 s, 4 nodes (compute ms / pair MB/s / read MB/s): n1 120/980/310, ...; flagged
    n3: compute 412 ms per pass vs 150 ...``, or None without one."""
    found = records(BurnIn, value)
    if not found:
        return None
    last = found[-1]
    cells = [f"{s.node} {_num(s.compute_ms)}/{_num(s.allreduce_mb_s)}/{_num(s.read_mb_s)}" for s in last.scores][
        :SCORES_SHOWN
    ]
    more = len(last.scores) - SCORES_SHOWN
    flagged = "; ".join(f"{s.node}: {s.reason}" for s in last.scores if s.flagged) or "nobody"
    head = f"{_num(last.seconds)} s, {len(last.nodes)} nodes (compute ms / pair MB/s / read MB/s): "
    tail = f" (and {more} more)" if more > 0 else ""
    action = f" -> {last.action}" if last.action and last.flagged else ""
    return printable(f"{head}{', '.join(cells)}{tail}; flagged {flagged}{action}")


def evictions_text(value: Any) -> str | None:
    """``n3 at step 12 (forward 412 ms vs 150 ms, 2.7x, slow for 10 s): swapped for a spare, training on
    n1,n2,n4,n5``, or None."""
    found = records(Eviction, value)
    if not found:
        return None
    parts = []
    for one in found[-SHOWN:]:
        at = f" at step {one.step}" if one.step is not None else ""
        what = "step compute" if one.compute_kind == "step" else "forward"
        why = f"{what} {_num(one.node_ms)} ms vs {_num(one.others_ms)} ms, {_num(one.ratio)}x"
        parts.append(f"{one.node}{at} ({why}, slow for {_num(one.slow_for_s)} s): {_done(one.action, one.nodes)}")
    return printable("; ".join(parts))


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"
