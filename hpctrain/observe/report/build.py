"""The report verb (``hpctrain report``, ``hpctrain.report``): load the runs, compute the table, draw the
PNGs, write report.md and report.html; :func:`report` is the sequence both faces call.

The only module of the report that writes files, and it writes only its own
outputs (report.md, report.html, scaling.png, run-*.png) into the out
directory: a file of those names that an earlier report did not write is left
alone and the report stops with an error naming it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.contract.rundir import atomic_write_text, report_dir
from hpctrain.contract.runfiles import RunFileError, open_regular
from hpctrain.errors import RunDirError, UsageError
from hpctrain.observe.report import plots, render
from hpctrain.observe.report.baselines import BASELINES
from hpctrain.observe.report.explain import explain
from hpctrain.observe.report.load import RunData, load_targets
from hpctrain.observe.report.render import MARKER, html_page, markdown
from hpctrain.observe.report.table import scaling_table, series_summary

PNG_TAG = plots.PNG_SOFTWARE.encode()  # in each PNG's Software text chunk (near the start)


@dataclass
class Written:
    report: render.Report
    out_dir: Path
    files: list[Path]


def default_out_dir(targets: list[Path], out: Path | None) -> Path:
    if out is not None:
        return Path(out).expanduser()
    if len(targets) == 1:
        return report_dir(Path(targets[0]).expanduser())
    raise UsageError("with several runs, say where the report goes", hint="add --out DIR")


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_") or "run"


def _ours(path: Path) -> bool:
    """Whether ``path`` is missing or was written by an earlier report (safe to replace)."""
    try:
        with open_regular(path) as handle:  # a FIFO or a device under the name is not ours, and is not read
            head = handle.read(4096)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except (OSError, RunFileError):
        return False
    return MARKER.encode() in head or PNG_TAG in head


def _check_writable(paths: list[Path]) -> None:
    foreign = [p for p in paths if not _ours(p)]
    if foreign:
        raise UsageError(
            f"{foreign[0]} exists and was not written by 'hpctrain report'; not overwriting it",
            hint="choose another directory with --out DIR",
        )


def make_report(targets: list[Path], out: Path | None, baseline: str | None = None) -> Written:
    out_dir = default_out_dir(targets, out)
    runs = load_targets(targets)
    if not any(run.has_metrics or run.summary for run in runs):
        raise RunDirError(
            "nothing to report: " + "; ".join(f"{run.label}: {' '.join(run.notes) or 'no data'}" for run in runs),
            hint="report a run once it has logged steps (metrics.jsonl) or written summary.json",
        )
    rows = scaling_table(runs)
    report = render.Report(runs=runs, rows=rows, baseline=BASELINES[baseline] if baseline else None)
    report.explanation = explain(runs, rows)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"{out_dir} is not a directory", hint="choose another directory with --out DIR")
    images = _image_paths(runs, out_dir)
    _check_writable([out_dir / "report.md", out_dir / "report.html", *images.values()])
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"cannot create {out_dir}: {exc.strerror}", hint="choose another directory with --out DIR"
        ) from None
    try:
        files = _draw(report, images)
        for name, text in (("report.md", markdown(report, out_dir)), ("report.html", html_page(report))):
            atomic_write_text(out_dir / name, text)
            _readable(out_dir / name)
            files.append(out_dir / name)
    except OSError as exc:
        raise UsageError(
            f"cannot write the report into {out_dir}: {exc.strerror or exc}",
            hint="choose a writable directory with --out DIR",
        ) from None
    return Written(report, out_dir, files)


def _image_paths(runs: list[RunData], out_dir: Path) -> dict[str, Path]:
    """The PNG of each run with metrics (key: its label) and of the scaling figure (key "")."""
    paths: dict[str, Path] = {"": out_dir / "scaling.png"}
    taken: set[str] = set()
    for run in runs:
        if run.has_metrics:
            name, count = f"run-{_slug(run.label)}", 1
            while name in taken:  # labels that differ only in characters a file name cannot keep
                count += 1
                name = f"run-{_slug(run.label)}-{count}"
            taken.add(name)
            paths[run.label] = out_dir / f"{name}.png"
    return paths


def _draw(report: render.Report, images: dict[str, Path]) -> list[Path]:
    if not plots.available():
        report.notes.append(f"no plots: matplotlib is not installed ({plots.INSTALL_HINT})")
        return []
    files = []
    for run in report.runs:
        path = images.get(run.label)
        if path is not None and _drawn(report, f"the plot of {run.label}", plots.plot_run, run, path):
            report.run_images[run.label] = path
            files.append(path)
    measured = [row for row in report.rows if row.images_per_s is not None and row.devices]
    wanted = len(measured) >= 2 or (measured and report.baseline is not None)
    if wanted and _drawn(report, "the scaling plot", plots.plot_scaling, report.rows, images[""], report.baseline):
        report.scaling_image = images[""]
        files.append(images[""])
    return files


def _drawn(report: render.Report, what: str, draw: Any, *args: Any) -> bool:
    """Draw one figure; data matplotlib cannot draw costs that figure (noted), not the report."""
    try:
        draw(*args)
    except OSError:
        raise
    except Exception as exc:  # matplotlib raises many types on odd data; the tables are still worth writing
        report.notes.append(f"could not draw {what}: {type(exc).__name__}: {exc}")
        return False
    return True


def _readable(path: Path) -> None:
    """The atomic write leaves 0600; a report on a shared file system is for the group to read (umask decides)."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)


@dataclass(frozen=True)
class Report:
    """A written report (``hpctrain report``, ``hpctrain.report``): ``html`` (self-contained) and ``markdown``
    in ``out_dir`` with ``files`` (the PNGs among them); ``table``: the scaling table's rows, ``runs``:
    each run's curves in brief (its notes among them), ``notes``: what could not be read or drawn.
    ``as_json()`` is what ``report --json`` prints."""

    out_dir: Path
    html: Path
    markdown: Path
    files: tuple[Path, ...]
    table: tuple[dict[str, Any], ...]
    runs: tuple[dict[str, Any], ...]
    notes: tuple[str, ...]
    document: dict[str, Any] = field(compare=False, repr=False, default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return self.document


def report(
    targets: str | Path | list[str | Path], out: str | Path | None = None, baseline: str | None = None
) -> Report:
    """The report verb's one sequence: plots and tables from runs and studies, as ``report.html`` and
    ``report.md`` in ``out`` (default: RUN/report for one run; required for several). Never overwrites a
    file it did not write (``UsageError``)."""
    listed = [targets] if isinstance(targets, (str, Path)) else list(targets)
    written = make_report([Path(t) for t in listed], Path(out) if out is not None else None, baseline)
    facts = as_json(written)
    return Report(
        out_dir=written.out_dir,
        html=written.out_dir / "report.html",
        markdown=written.out_dir / "report.md",
        files=tuple(written.files),
        table=tuple(facts["table"]),
        runs=tuple(facts["runs"]),
        notes=tuple(facts["notes"]),
        document=facts,
    )


def as_json(written: Written) -> dict[str, Any]:
    report = written.report
    return {
        "out_dir": str(written.out_dir),
        "files": [str(p) for p in written.files],
        "notes": report.notes,
        "runs": [series_summary(run) for run in report.runs],
        "table": [row.as_dict() for row in report.rows],
        "waterfall": report.explanation.as_dict(),
        "baseline": None
        if report.baseline is None
        else {
            "name": report.baseline.name,
            "sources": list(report.baseline.sources),
            "points": [
                {
                    "gpus": p.gpus,
                    "images_per_s": p.images_per_s,
                    "epoch_s": p.epoch_s,
                    "top1": p.top1,
                    "efficiency": report.baseline.efficiency(p),
                }
                for p in report.baseline.points
            ],
        },
    }
