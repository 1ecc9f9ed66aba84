"""A spec for a user's script (``hpctrain init NAME --script train.py``): the style it is written in, read from
its text, and the spec that runs it that way.

Three styles are told apart by what the script's text says (it is never run
or imported): ``mp.spawn`` (one process per node that starts its workers:
``per: node``, and HAL's ``--dist-url/--world-size/--rank`` when it takes
them), ``--local_rank`` on its command line (``torch.distributed.launch``:
``per: rank`` with ``--local_rank={local_rank}``), and otherwise torchrun's
environment (``per: rank``). A script that installs no signal handler is
told, in a comment, what that means for its resume. Torch-free.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from hpctrain.errors import UsageError
from hpctrain.jobscript.templates import fill_yaml, read_template

MAX_SCRIPT_BYTES = 4 * 1024 * 1024  # what is read of the script to recognise its style
_SPAWN = re.compile(r"\b(mp|multiprocessing|torch\.multiprocessing)\.spawn\(|\bstart_processes\(")
_LOCAL_RANK_ARG = re.compile(r"""["']--local[_-]rank["']""")
_DIST_URL_ARG = re.compile(r"""["']--dist[_-]url["']""")
HAL_ARGS = ("--dist-url", "tcp://{master_addr}:{master_port}", "--world-size", "{nnodes}", "--rank", "{node_rank}")
NO_HANDLER = (
    "\nIt installs no signal handler: at a stop it ends at once and resumes from what it saved last;"
    "\nsave on SIGTERM (docs/scripts.md#what-a-script-does-to-resume) to lose nothing."
)


@dataclass(frozen=True)
class ScriptStyle:
    per: str
    args: list[str]
    says: str  # the spec's comment on it (lines without their '#')

    @property
    def per_comment(self) -> str:
        if self.per == "node":
            return "one process per node, which starts its own workers (mp.spawn)"
        return "one process per rank, with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT set"


def read_script(path: Path) -> str:
    """The script's text (bounded); a UsageError naming the problem when it cannot be read."""
    if not path.is_file():
        raise UsageError(f"--script {path}: no such file", hint="name your training script, e.g. --script train.py")
    try:
        with open(path, "rb") as handle:
            return handle.read(MAX_SCRIPT_BYTES).decode("utf-8", errors="replace")
    except OSError as exc:
        raise UsageError(f"--script {path}: cannot be read ({exc.strerror})") from None


def style_of(text: str) -> ScriptStyle:
    """How the script expects to be started, from its text. Pure."""
    stops = "signal.signal(" in text or "HPCTRAIN_STOP_SIGNAL" in text or "hpctrain.task" in text
    note = "" if stops else NO_HANDLER
    if _SPAWN.search(text):
        args = list(HAL_ARGS) if _DIST_URL_ARG.search(text) else []
        if "--multiprocessing-distributed" in text:
            args.append("--multiprocessing-distributed")
        says = "Its text starts workers with mp.spawn: one process per node, as HAL's tutorial runs it."
        return ScriptStyle("node", args, says + note)
    if _LOCAL_RANK_ARG.search(text):
        says = "It takes --local_rank, as under torch.distributed.launch: hpctrain passes each rank's."
        return ScriptStyle("rank", ["--local_rank={local_rank}"], says + note)
    says = "It reads its rank from the environment, as under torchrun: hpctrain sets torchrun's variables."
    return ScriptStyle("rank", [], says + note)


def render(
    name: str,
    path: Path,
    script: str,
    style: ScriptStyle,
    *,
    nodes: int,
    gpus_per_node: int,
    cluster: str,
    tasks_per_node: int | None = None,
) -> str:
    """The spec's text (``script``: as the user wrote it, relative to where hpctrain runs)."""
    return fill_yaml(
        read_template("script_job.yaml"),
        {
            "name": name,
            "path": str(path),
            "script": script,
            "style": style.says,
            "cluster": cluster,
            "nodes": nodes,
            "gpus_per_node": gpus_per_node,
            "tasks_per_node": tasks_per_node,
            "time": "24:00:00" if gpus_per_node else "01:00:00",
            "per": style.per,
            "per_comment": style.per_comment,
            "args": style.args,
        },
    )
