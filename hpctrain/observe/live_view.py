"""How a :class:`~hpctrain.observe.live_status.Snapshot` looks: plain lines for logs and pipes,
a rich view for terminals.

Plain output is meant for ``| tee`` and job logs: :func:`plain_changes`
returns timestamped lines only for what changed since the previous snapshot
(progress, checkpoint, Slurm state, stragglers, stale heartbeats, a hang),
never a redraw. :func:`rich_view` is the terminal's live panel. Both are pure
and torch-free; the watch loop (``hpctrain.observe.watch``) prints them.
"""

from __future__ import annotations

import math
import time

from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from hpctrain.contract.runfiles import for_rich
from hpctrain.contract.slurm_states import is_running
from hpctrain.observe.live_status import RankView, Snapshot

RANK_ROWS = 16  # the rank table shows at most this many ranks (flagged ones first), then "N more"


def stamp(now: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))


def duration(seconds: float | None) -> str:
    """3 s, 4m05s, 1h02m, 2d03h; '?' when unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "?"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def _of(done: int | None, total: int | None) -> str:
    if done is None:
        return "?"
    return f"{done}/{total}" if total else str(done)


NO_SCRIPT_STEPS = "steps not reported (the script's hpctrain.task.step/log would report them)"


def progress_text(snap: Snapshot) -> str:
    """``epoch 1/2 step 3/4 | global step 3/8 (38%) | 512.0 img/s | data-wait 12% | eta 4m05s``."""
    parts = []
    if not snap.script or snap.epoch is not None:  # a script that reports no epochs: no 'epoch ? step ?'
        parts.append(f"epoch {_of(snap.epoch, snap.epochs)} step {_of(snap.step_in_epoch, snap.steps_per_epoch)}")
    share = f" ({100 * snap.global_step / snap.total_steps:.0f}%)" if snap.total_steps and snap.global_step else ""
    if snap.script and snap.global_step is None:
        parts.append(NO_SCRIPT_STEPS)
    else:
        parts.append(f"global step {_of(snap.global_step, snap.total_steps)}{share}")
    if snap.images_per_s is not None:
        parts.append(f"{snap.images_per_s:.1f} img/s")
    if snap.data_wait_fraction is not None:
        parts.append(f"data-wait {100 * snap.data_wait_fraction:.0f}%")
    if not snap.final:
        parts.append(f"eta {duration(snap.eta_s)}")
    if snap.val_top1 is not None:
        parts.append(f"val top1 {snap.val_top1:.2f}")
    if snap.step_split:
        parts.append(f"step: {snap.step_split}")
    return " | ".join(parts)


def checkpoint_text(snap: Snapshot) -> str:
    if snap.checkpoint_step is None:
        return "none yet"
    return f"step {snap.checkpoint_step} ({duration(snap.checkpoint_age_s)} ago)"


def head_text(snap: Snapshot) -> str:
    job = f"job {snap.job_id}" if snap.job_id else "run"
    status = snap.status or ("starting" if is_running(snap.slurm_state) else "?")  # no summary.json yet
    return f"{job} {snap.slurm_state}, run {status}"


def alerts(snap: Snapshot) -> list[str]:
    """The things a user must look at: a hang, stragglers, ranks that stopped writing heartbeats, a failure."""
    found = []
    if snap.hung_rank is not None:
        found.append(f"HANG: rank {snap.hung_rank} on {snap.hung_node or '?'} stopped in {snap.hung_phase or '?'}")
    by_rank = {view.rank: view for view in snap.ranks}
    for rank in snap.stragglers:
        view = by_rank[rank]
        found.append(f"straggler: rank {rank} on {view.node or '?'} ({_step_time(view)} per step)")
    for rank in snap.stale_ranks:
        view = by_rank[rank]
        found.append(
            f"stale heartbeat: rank {rank} on {view.node or '?'} last wrote {duration(view.age_s)} ago "
            f"(step {view.step}, {view.phase})"
        )
    if snap.failed_rank is not None or snap.failed_node is not None:  # a script per node fails as a node
        reason = f": {snap.failed_reason}" if snap.failed_reason else ""
        who = f"rank {snap.failed_rank} on {snap.failed_node or '?'}" if snap.failed_rank is not None else ""
        found.append(f"failed first: {who or f'node {snap.failed_node}'}{reason}")
    if snap.lost_nodes:
        found.append(f"lost nodes: {snap.lost_nodes}")
    if snap.evictions:
        found.append(f"evicted: {snap.evictions}")
    if snap.burn_in:
        found.append(f"burn-in: {snap.burn_in}")
    return found


def _step_time(view: RankView) -> str:
    return "?" if view.step_time_median_s is None else f"{view.step_time_median_s:.3f} s"


def rank_line(view: RankView) -> str:
    flags = "".join((" STALE" if view.stale else "", " STRAGGLER" if view.straggler else ""))
    gpu = f", gpu {view.gpu_util_pct:.0f}%" if view.gpu_util_pct is not None else ""
    return (
        f"rank {view.rank} {view.node or '?'} step {view.step} {view.phase} "
        f"step time {_step_time(view)}{gpu}, heartbeat {duration(view.age_s)} ago{flags}"
    )


def shown_ranks(ranks: tuple[RankView, ...], limit: int = RANK_ROWS) -> tuple[list[RankView], int]:
    """The ranks a table shows (all, or the flagged ones and then the lowest ranks) and how many it leaves out."""
    if len(ranks) <= limit:
        return list(ranks), 0
    flagged = [view for view in ranks if view.stale or view.straggler]
    rest = [view for view in ranks if not (view.stale or view.straggler)]
    shown = sorted((flagged + rest)[:limit], key=lambda view: view.rank)
    return shown, len(ranks) - len(shown)


# ------------------------------------------------------------------ plain


def _progress_key(snap: Snapshot) -> tuple:
    return (snap.slurm_state, snap.status, snap.global_step, snap.epoch, snap.checkpoint_step, snap.restarts)


def plain_changes(previous: Snapshot | None, snap: Snapshot, *, show_ranks: bool = False) -> list[str]:
    """Timestamped lines for what changed since ``previous`` (everything, the first time)."""
    lines = []
    if previous is None or _progress_key(previous) != _progress_key(snap):
        restarts = f" | restarts {snap.restarts}" if snap.restarts else ""
        lines.append(f"{head_text(snap)} | {progress_text(snap)} | checkpoint {checkpoint_text(snap)}{restarts}")
    announced = _alert_keys(previous)
    lines += [alert for alert in alerts(snap) if _alert_key(alert) not in announced]
    if previous is not None and (previous.stragglers and not snap.stragglers):
        lines.append("stragglers: none any more")
    first_ranks = snap.ranks and (previous is None or not previous.ranks)
    if show_ranks or first_ranks:
        before = {view.rank: (view.step, view.phase) for view in (previous.ranks if previous else ())}
        changed = [view for view in snap.ranks if first_ranks or before.get(view.rank) != (view.step, view.phase)]
        lines += [rank_line(view) for view in (changed if show_ranks else shown_ranks(snap.ranks)[0])]
    return [f"{stamp(snap.now)} {line}" for line in lines]


def _alert_key(alert: str) -> str:
    """An alert without its changing numbers (ages), so a stale rank is announced once, not every poll."""
    return alert.split(" last wrote ")[0].split(" (")[0]


def _alert_keys(snap: Snapshot | None) -> set[str]:
    return {_alert_key(alert) for alert in alerts(snap)} if snap is not None else set()


def final_lines(snap: Snapshot) -> list[str]:
    """The last block of a watch (and the last line says how the job ended)."""
    lines = [rank_line(view) for view in shown_ranks(snap.ranks)[0]]
    lines.append(f"{head_text(snap)} | {progress_text(snap)} | checkpoint {checkpoint_text(snap)}")
    ended = f"job {snap.job_id} ended {snap.slurm_state}"
    if snap.slurm_state == "local" or not snap.job_id:
        ended = f"{snap.slurm_state} run ended" if snap.slurm_state == "local" else "run ended"
    why = f" ({snap.stop_reason})" if snap.stop_reason else ""
    lines.append(f"{ended}; run status: {snap.status or 'unknown'}{why}")
    return [f"{stamp(snap.now)} {line}" for line in lines]


# ------------------------------------------------------------------ rich


def _bar(done: float | None, total: float | None) -> RenderableType:
    if done is None or not total:
        return Text("?")
    return ProgressBar(total=float(total), completed=min(float(done), float(total)), width=40)


def rich_view(snap: Snapshot, *, interval_s: float | None = None) -> RenderableType:
    """The terminal's live panel: header, progress bars, numbers, alerts, rank table."""
    style = "green" if snap.status == "completed" else "red" if snap.status == "failed" else "bold"
    header = Text.assemble((snap.name or "run", "bold"), "  ", (head_text(snap), style))
    if interval_s is not None and not snap.final:
        header.append(f"   (every {interval_s:g} s, Ctrl-C to leave)", style="dim")
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="cyan", justify="right")
    grid.add_column()
    grid.add_column()
    epoch_done = None
    if snap.epoch is not None and snap.step_in_epoch is not None and snap.steps_per_epoch:
        epoch_done = snap.epoch - 1 + snap.step_in_epoch / snap.steps_per_epoch
    if not snap.script or snap.epoch is not None:
        grid.add_row("epoch", _bar(epoch_done, snap.epochs), _of(snap.epoch, snap.epochs))
        steps = _of(snap.step_in_epoch, snap.steps_per_epoch)
        grid.add_row("step", _bar(snap.step_in_epoch, snap.steps_per_epoch), steps)
    if snap.script and snap.global_step is None:
        grid.add_row("global step", NO_SCRIPT_STEPS, "")
    else:
        grid.add_row("global step", _bar(snap.global_step, snap.total_steps), _of(snap.global_step, snap.total_steps))
    rate = "?" if snap.images_per_s is None else f"{snap.images_per_s:.1f} img/s"
    grid.add_row("speed", rate, "" if snap.final else f"eta {duration(snap.eta_s)}")
    wait = "?" if snap.data_wait_fraction is None else f"{100 * snap.data_wait_fraction:.0f}%"
    grid.add_row("data wait", wait, "")
    if snap.step_split:
        grid.add_row("step time", snap.step_split, "")
    grid.add_row("checkpoint", checkpoint_text(snap), "")
    grid.add_row("restarts", str(snap.restarts or 0), "")
    if snap.val_top1 is not None:
        best = f"best {snap.best_val_top1:.2f}" if snap.best_val_top1 is not None else ""
        grid.add_row("val top1", f"{snap.val_top1:.2f}", best)
    parts: list[RenderableType] = [header, grid]
    for alert in alerts(snap):
        parts.append(Text(alert, style="bold red" if alert.startswith(("HANG", "failed")) else "yellow"))
    if snap.ranks:
        parts.append(rank_table(snap.ranks))
    return Group(*parts)


def rank_table(ranks: tuple[RankView, ...], limit: int = RANK_ROWS) -> Table:
    shown, left_out = shown_ranks(ranks, limit)
    table = Table(title="ranks' last heartbeats", title_justify="left", caption_justify="left")
    gpu = any(view.gpu_util_pct is not None for view in ranks)
    for column in ("rank", "node", "step", "phase", "step time", *(("gpu",) if gpu else ()), "heartbeat", "flags"):
        table.add_column(column)
    for view in shown:
        flag = " ".join(word for word, on in (("STALE", view.stale), ("STRAGGLER", view.straggler)) if on)
        util = () if not gpu else ("?" if view.gpu_util_pct is None else f"{view.gpu_util_pct:.0f}%",)
        table.add_row(
            str(view.rank),
            for_rich(view.node or "?"),
            str(view.step),
            for_rich(view.phase),
            _step_time(view),
            *util,
            f"{duration(view.age_s)} ago",
            Text(flag, style="bold red") if flag else "",
        )
    if left_out:
        table.caption = f"{left_out} more ranks (hpctrain status RUN --ranks lists all)"
    return table
