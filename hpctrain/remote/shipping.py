"""What a remote submit sends, and the laptop's record of a submit in flight. Torch-free.

A submit ships the project folder (the folder it is run from) to the login
node: in a git work tree the files git lists (tracked, and untracked ones it
does not ignore), else every file below; never a hidden file or folder, a
symlink or bytecode, and no more than a code snapshot may hold. The login
node's ``hpctrain submit`` then takes the run's own code snapshot from that
copy, by the usual rules (``launch/code_selection.py``).

Exactly once: each submit (and each resume) has a token chosen here, kept
in ``CONFIG_DIR/remote/pending/`` under a key of (cluster, the command line,
the spec's bytes) until the login node's answer arrives. A retry of the same
command after a dropped connection finds the token, and the login node
(``RUN_ONCE``) answers from the first attempt instead of running it again.
"""

from __future__ import annotations

import hashlib
import io
import os
import secrets
import subprocess
import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from hpctrain.contract.file_writes import write_atomic
from hpctrain.errors import RemoteError, UsageError
from hpctrain.jobspec.profiles import config_dir
from hpctrain.launch.code_snapshot import MAX_SNAPSHOT_BYTES, MAX_SNAPSHOT_FILES

TOKEN_CHARS = set("0123456789abcdef")

# Read by `sh -s` from stdin on the login node with $1 = token, $2 = where the command runs ("tree": the
# shipped project, which RECEIVE made; "home": the home folder, for a verb that ships nothing, such as
# resume), $3... = the hpctrain command. The first attempt claims the token (mkdir is atomic) and starts
# the command detached (setsid, no terminal), so a dropped connection does not stop it half-way; every
# attempt then waits for its exit status and prints what it printed. A claim whose process died without a
# status is said, never run again.
RUN_ONCE = r"""
token=$1; where=$2; shift 2
stage="$HOME/hpctrain-submits/$token"
if [ "$where" = tree ]; then
  cd "$stage" 2>/dev/null || { echo "hpctrain-remote: nothing shipped for $token" >&2; exit 97; }
  workdir="$stage/tree"
else
  umask 077; mkdir -p "$stage" && cd "$stage" || exit 96
  workdir="$HOME"
fi
if mkdir claim 2>/dev/null; then
  if command -v setsid >/dev/null 2>&1; then detach=setsid; else detach=; fi
  run='s=$1; cd "$2" && shift 2 && HPCTRAIN_REMOTE_SIDE=1 "$@" >"$s/out" 2>"$s/err" </dev/null'
  run="$run"'; echo $? >"$s/rc.tmp"; mv "$s/rc.tmp" "$s/rc"'
  $detach sh -c "$run" sh "$stage" "$workdir" "$@" </dev/null >/dev/null 2>&1 &
  echo $! >claim/pid.tmp && mv claim/pid.tmp claim/pid
fi
waited=0
while [ ! -f rc ]; do
  if [ -f claim/pid ]; then
    if ! kill -0 "$(cat claim/pid)" 2>/dev/null && [ ! -f rc ]; then
      echo "hpctrain-remote: the first attempt stopped before it ended" >&2; exit 98
    fi
  elif [ "$waited" -gt 30 ]; then
    echo "hpctrain-remote: the first attempt stopped before it ended" >&2; exit 98
  fi
  waited=$((waited + 1)); sleep 1
done
cat err >&2; cat out; exit "$(cat rc)"
"""

# $1 = token: make the stage (unless a first attempt already claimed it) and unpack the tar on stdin.
# One line, so that any login shell hands it to sh unchanged.
RECEIVE = (
    'stage="$HOME/hpctrain-submits/$1"; umask 077; mkdir -p "$stage" && cd "$stage" || exit 96; '
    "if [ -d claim ]; then cat >/dev/null; echo claimed; exit 0; fi; "
    "rm -rf tree.tmp && mkdir tree.tmp && tar -xf - -C tree.tmp && rm -rf tree && mv tree.tmp tree && echo shipped"
)


def new_token() -> str:
    return secrets.token_hex(12)


def pending_key(cluster: str, argv: Sequence[str], spec_bytes: bytes) -> str:
    digest = hashlib.sha256()
    for part in (cluster, *argv):
        digest.update(part.encode() + b"\0")
    digest.update(spec_bytes)
    return digest.hexdigest()[:32]


def pending_file(key: str, environ: dict[str, str] | None = None) -> Path:
    return config_dir(environ) / "remote" / "pending" / key


def token_for(key: str, environ: dict[str, str] | None = None) -> tuple[str, bool]:
    """The token of this submit: the one kept from an attempt that got no answer, else a new one kept now."""
    path = pending_file(key, environ)
    try:
        kept = path.read_text().strip()
    except OSError:
        kept = ""
    if len(kept) == 24 and set(kept) <= TOKEN_CHARS:
        return kept, True
    token = new_token()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomic(path, token + "\n")
    return token, False


def settled(key: str, environ: dict[str, str] | None = None) -> None:
    """The login node answered: the next submit of the same command is a new submit."""
    try:
        pending_file(key, environ).unlink()
    except FileNotFoundError:
        pass


def project_files(project: Path) -> list[Path]:
    """The files a submit ships, relative to ``project``."""
    listed = _git_listed(project)
    names = sorted(listed) if listed is not None else sorted(_walked(project))
    chosen = [name for name in names if _shippable(project, name)]
    total = sum((project / name).stat().st_size for name in chosen)
    if len(chosen) > MAX_SNAPSHOT_FILES or total > MAX_SNAPSHOT_BYTES:
        raise UsageError(
            f"{project} holds {len(chosen)} files, {total / 2**20:.0f} MiB: more than a submit ships "
            f"({MAX_SNAPSHOT_FILES} files, {MAX_SNAPSHOT_BYTES // 2**20} MiB)",
            hint="run the submit from your project's folder (a git work tree ships only what git lists; "
            "keep data and runs out of it or in .gitignore)",
        )
    return chosen


def tar_stream(project: Path, files: Sequence[Path]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # in memory
        for name in files:
            info = tar.gettarinfo(str(project / name), arcname=str(name))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(project / name, "rb") as handle:
                tar.addfile(info, handle)
    return buffer.getvalue()


def unpack(data: bytes, destination: Path) -> list[str]:
    """A tar from the login node (a report's files), unpacked with tarfile's 'data' filter: no links out,
    no absolute paths, no devices."""
    destination.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
            names = [member.name for member in tar.getmembers() if member.isfile()]
            tar.extractall(destination, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise RemoteError(f"the files from the login node were refused: {exc}", "ship") from None
    return names


def _shippable(project: Path, name: Path) -> bool:
    if any(part.startswith(".") for part in name.parts) or name.suffix in (".pyc", ".pyo"):
        return False
    path = project / name
    return path.is_file() and not path.is_symlink()


def _walked(project: Path) -> Iterator[Path]:
    for folder, dirs, files in os.walk(project):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
        for file in files:
            yield (Path(folder) / file).relative_to(project)


def _git_listed(project: Path) -> set[Path] | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(project), "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "."],
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return {Path(os.fsdecode(name)) for name in done.stdout.split(b"\0") if name}
