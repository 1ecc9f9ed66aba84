"""Whether the trackers a spec names can be reached from here: one bounded look before ``submit`` queues the job.

``validate`` refuses a tracking URI that can never work (its form: no host, a
bad port, a relative file store; ``jobspec/tracking.py``), with no network.
What only the network can say is asked here, by the submit's checks before
the queue (``launch/plan.py``'s ``check_before_queueing``, once for a study;
``--no-preflight`` skips it), never longer than about :data:`TIMEOUT_S`:

* an MLflow server (``http``/``https``): ``GET BASE/health``, which every
  ``mlflow server`` answers with ``OK`` and no credentials. A host this machine
  cannot resolve, a refused connection, no answer in time, a TLS failure, or
  an answer that is not MLflow's are **warnings** naming
  ``tracking.mlflow.tracking_uri`` and the likely fix: the run trains
  whatever the tracker does (nothing of the job talks to it), and a server
  that is down now may be up when ``hpctrain sync`` runs, so none of these
  stops the submit.
* a file or SQLite store: its folder must exist here (``hpctrain sync``
  creates the store, not the folders above it).
* W&B ``mode: online``: an API key where ``hpctrain sync`` will run
  (``WANDB_API_KEY`` or ``wandb login``'s ``~/.netrc``); W&B's own server is
  not asked (login nodes often cannot reach it; offline mode needs nothing).

Credentials are never read here beyond whether they are set, and never printed.
"""

from __future__ import annotations

import os
import socket
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from hpctrain.diagnose.findings import Finding

if TYPE_CHECKING:
    from hpctrain.jobspec.models import JobSpec

TIMEOUT_S = 3.0
URI_KEY = "tracking.mlflow.tracking_uri"
TRAINS_ANYWAY = "the run trains regardless; 'hpctrain sync' sends its steps once the server answers"

Fetch = Callable[[str, float], tuple[int, bytes]]  # url, timeout -> (HTTP status, first bytes of the body)


def check_trackers(
    spec: JobSpec,
    *,
    timeout_s: float = TIMEOUT_S,
    fetch: Fetch | None = None,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
) -> list[Finding]:
    """The warnings about the spec's trackers, asked of the network at most once each, bounded."""
    findings: list[Finding] = []
    mlflow, wandb = spec.tracking.mlflow, spec.tracking.wandb
    if mlflow is not None:
        findings += check_mlflow_uri(mlflow.tracking_uri, timeout_s=timeout_s, fetch=fetch or http_get)
    if wandb is not None and wandb.mode == "online":
        findings += check_wandb_key(os.environ if environ is None else environ, home or Path.home())
    return findings


def check_mlflow_uri(uri: str, *, timeout_s: float = TIMEOUT_S, fetch: Fetch) -> list[Finding]:
    parts = urlsplit(uri)
    if parts.scheme in ("file", "sqlite"):
        store = Path(parts.path if parts.scheme == "file" else parts.path[1:]).expanduser()
        if not store.exists() and not store.parent.is_dir():
            return [
                Finding(
                    "warning",
                    URI_KEY,
                    f"{parts.scheme} store {store}: its folder {store.parent} does not exist here; create it (or "
                    "fix the path) before 'hpctrain sync', which creates the store but not the folders above it",
                )
            ]
        return []
    if parts.scheme not in ("http", "https"):
        return []  # databricks: its own profile and login, not ours to probe
    health = uri.rstrip("/") + "/health"
    try:
        status, body = _bounded(lambda: fetch(health, timeout_s), timeout_s + 1.0)
    except TimeoutError:
        return [
            _warn(f"{uri} did not answer within {timeout_s:g} s (a firewall, or a server that hangs); {TRAINS_ANYWAY}")
        ]
    except OSError as exc:
        return [_warn(_why_not(uri, parts.hostname or "", exc))]
    if status == 200 and body.strip().startswith(b"OK"):
        return []
    if status in (401, 403):
        return [
            _warn(
                f"{uri} answered HTTP {status} on /health: it asks for credentials; set MLFLOW_TRACKING_USERNAME and "
                "MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) where 'hpctrain sync' runs"
            )
        ]
    return [
        _warn(
            f"{uri} answered HTTP {status} on /health, not as an MLflow server does: check that the URI is the "
            "server's base address (as 'mlflow server' prints it, e.g. http://host:5000), not a page of its UI"
        )
    ]


def check_wandb_key(environ: Mapping[str, str], home: Path) -> list[Finding]:
    """W&B online needs a key where ``hpctrain sync`` runs: ``WANDB_API_KEY`` or ``wandb login``'s netrc."""
    if environ.get("WANDB_API_KEY"):
        return []
    netrc = Path(environ.get("NETRC") or home / ".netrc")
    try:
        if "api.wandb.ai" in netrc.read_text(errors="replace")[:1_000_000]:
            return []
    except OSError:
        pass
    return [
        Finding(
            "warning",
            "tracking.wandb.mode",
            "online, but no W&B API key here (WANDB_API_KEY, or 'wandb login'): 'hpctrain sync' cannot send until "
            "there is one; or use mode: offline and 'wandb sync' where W&B is reachable",
        )
    ]


def http_get(url: str, timeout_s: float) -> tuple[int, bytes]:
    """One GET (redirects followed, as urllib does): (HTTP status, the first 64 bytes of the body)."""
    request = urllib.request.Request(url, headers={"User-Agent": "hpctrain-preflight"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:  # noqa: S310 - http(s) only
            return answer.status, answer.read(64)
    except urllib.error.HTTPError as exc:
        return exc.code, b""
    except urllib.error.URLError as exc:
        reason = exc.reason
        raise reason if isinstance(reason, OSError) else OSError(str(reason)) from None


def _bounded(call: Callable[[], tuple[int, bytes]], limit_s: float) -> tuple[int, bytes]:
    """``call()`` in a thread, given up after ``limit_s`` (a resolver that hangs is not bounded by urllib)."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["answer"] = call()
        except BaseException as exc:  # noqa: BLE001 - carried to the caller
            box["error"] = exc

    worker = threading.Thread(target=run, daemon=True, name="hpctrain-tracker-reach")
    worker.start()
    worker.join(limit_s)
    if worker.is_alive():
        raise TimeoutError
    if isinstance(error := box.get("error"), BaseException):
        raise error
    return box["answer"]  # type: ignore[return-value]


def _why_not(uri: str, host: str, exc: OSError) -> str:
    if isinstance(exc, socket.gaierror):
        return f"{uri}: host {host!r} is not known here (DNS); check the spelling, or sync from a machine that knows it"
    if isinstance(exc, ConnectionRefusedError):
        return f"{uri} refused the connection: no server on that port now (started? the right port?); {TRAINS_ANYWAY}"
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return f"{uri} did not answer in time (a firewall, or a server that hangs); {TRAINS_ANYWAY}"
    if isinstance(exc, ssl.SSLError):
        return (
            f"{uri}: TLS failed ({exc.reason or exc}): for a private CA set MLFLOW_TRACKING_SERVER_CERT_PATH where "
            "'hpctrain sync' runs, or check http vs https"
        )
    return f"{uri} could not be reached ({exc.strerror or exc}); {TRAINS_ANYWAY}"


def _warn(message: str) -> Finding:
    return Finding("warning", URI_KEY, message)
