"""The look at a spec's trackers before the queue (diagnose/tracker_reach.py), against real local sockets:
an MLflow-like /health, a web server that is not MLflow, one that wants credentials, a closed port, a
server that never answers; each a warning naming the key and the fix, bounded in time, never a refusal."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpctrain.diagnose.tracker_reach import check_mlflow_uri, check_trackers, check_wandb_key, http_get
from hpctrain.jobspec import tracking_checks
from hpctrain.jobspec.load import load_job
from hpctrain.launch.plan import check_before_queueing

pytestmark = pytest.mark.usefixtures("isolated")


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The servers here are this machine's: a proxy in the environment must not stand between."""
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


class Health(http.server.BaseHTTPRequestHandler):
    status, body = 200, b"OK"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(self.status if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[str]:
    status, body = getattr(request, "param", (200, b"OK"))
    handler = type("Answer", (Health,), {"status": status, "body": body})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def messages(uri: str, **kwargs: object) -> list[str]:
    return [f"{f.level} {f.key}: {f.message}" for f in check_mlflow_uri(uri, fetch=http_get, **kwargs)]  # type: ignore[arg-type]


def test_an_mlflow_server_that_answers_is_no_finding(server: str) -> None:
    assert messages(server) == [] and messages(server + "/") == []


@pytest.mark.parametrize(
    ("server", "needle"),
    [((404, b"nope"), "not as an MLflow server does"), ((401, b""), "MLFLOW_TRACKING_USERNAME")],
    indirect=["server"],
)
def test_a_server_that_is_not_mlflow_or_wants_credentials_is_said(server: str, needle: str) -> None:
    [found] = messages(server)
    assert found.startswith("warning tracking.mlflow.tracking_uri:") and needle in found


def test_a_closed_port_is_a_warning_that_the_run_trains_anyway() -> None:
    [found] = messages(f"http://127.0.0.1:{closed_port()}")
    assert "refused the connection" in found and "the run trains regardless" in found


def test_a_server_that_never_answers_is_given_up_on_in_time() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)  # accepts the connection, never answers
        began = time.monotonic()
        [found] = messages(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout_s=0.5)
        assert time.monotonic() - began < 5 and "did not answer" in found


def test_an_unknown_host_and_a_hanging_resolver_are_bounded() -> None:
    def unknown(url: str, timeout_s: float) -> tuple[int, bytes]:
        raise socket.gaierror(-2, "Name or service not known")

    [found] = check_mlflow_uri("http://mlfow.example.org:5000", fetch=unknown)
    assert "'mlfow.example.org' is not known here" in found.message

    def hangs(url: str, timeout_s: float) -> tuple[int, bytes]:
        time.sleep(30)
        return 200, b"OK"

    began = time.monotonic()
    [found] = check_mlflow_uri("http://slow:5000", fetch=hangs, timeout_s=0.2)
    assert time.monotonic() - began < 3 and "did not answer within 0.2 s" in found.message


def test_a_file_store_needs_its_folder_here(tmp_path: Path) -> None:
    assert messages(f"file://{tmp_path}/mlruns") == []
    [found] = messages(f"file://{tmp_path}/missing/mlruns")
    assert "missing does not exist here" in found
    assert messages("sqlite:////" + str(tmp_path / "m.db").lstrip("/")) == []
    assert messages("databricks") == []


def test_wandb_online_needs_a_key_where_sync_runs(tmp_path: Path) -> None:
    [found] = check_wandb_key({}, tmp_path)
    assert found.key == "tracking.wandb.mode" and "WANDB_API_KEY" in found.message
    assert check_wandb_key({"WANDB_API_KEY": "x" * 40}, tmp_path) == []
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password k\n")
    assert check_wandb_key({}, tmp_path) == []


SPEC = """\
name: t
cluster: local
output_dir: {out}
data: {{root: {data}}}
tracking: {{mlflow: {{tracking_uri: '{uri}'}}, wandb: {{project: p, mode: offline}}}}
"""


def test_submit_warns_before_the_queue_and_still_submits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracking_checks, "installed", lambda tracker: True)
    (tmp_path / "data" / "train").mkdir(parents=True)
    (tmp_path / "data" / "val").mkdir()
    spec = tmp_path / "job.yaml"
    uri = f"http://127.0.0.1:{closed_port()}"
    spec.write_text(SPEC.format(out=tmp_path / "runs", data=tmp_path / "data", uri=uri))
    job = load_job(spec)
    warnings = check_before_queueing(job, local=True)
    assert [w for w in warnings if "tracking.mlflow.tracking_uri" in w and "refused" in w], warnings
    assert check_trackers(job.spec, fetch=lambda url, timeout_s: (200, b"OK")) == []  # offline W&B: nothing to ask
