"""From a laptop through an OTP login node (issue 39): a real sshd that asks for a key AND a one-time code.

The "laptop" is this machine's hpctrain with a profile whose ``login:`` is a
real OpenSSH server on 127.0.0.1 (``tests/otp_sshd.py``: PAM keyboard-
interactive through a script that counts the prompts); the "login node" runs
the same hpctrain on a ``cluster: local`` profile, so a submit runs the job
there, in the foreground. Proven: one prompt for a whole sitting of many
verbs; a submit cut mid-way and retried runs its job once; an unknown or
changed host key, a login node without hpctrain and a dead master are each
one clear error, fast, with no prompt; paths with spaces and quotes arrive
whole. Needs root (skipped without, failed under CI).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from otp_sshd import OtpLogin, login_with_code, missing, on_terminal, otp_login  # noqa: E402

pytestmark = pytest.mark.local_dist

REPO = Path(__file__).resolve().parents[2]
HPCTRAIN = f"env PYTHONPATH={REPO} {sys.executable} -m hpctrain"
# The job: counts its runs in a file outside the run; while the test holds it (a file it creates and
# removes: ``hold``) it stays up (bounded), so a command can be cut mid-way however slow the machine is.
SCRIPT = """import os, pathlib, sys, time
with open(os.environ["COUNT_FILE"], "a") as out:
    out.write("ran\\n")
print("hello from the login node:", sys.argv[1:], flush=True)
hold, deadline = os.environ["HOLD_FILE"], time.monotonic() + 300
while os.path.exists(hold) and time.monotonic() < deadline:
    time.sleep(0.1)
"""


@pytest.fixture(scope="module")
def login() -> Iterator[OtpLogin]:
    why = missing()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"the OTP login node {why}")
        pytest.skip(why)
    with otp_login() as server:
        yield server


@pytest.fixture
def laptop(login: OtpLogin, tmp_path: Path) -> dict[str, str]:
    """The laptop's environment: a profile 'otp' with login:, and the login node's own 'otp' (local)."""
    login.trust(login.host_key())
    config = tmp_path / "laptop-config"
    (config / "clusters").mkdir(parents=True)
    profile = {
        "scheduler": "local",
        "login": {
            "host": "127.0.0.1",
            "user": "root",
            "port": login.port,
            "ssh_config": str(login.ssh_config),
            "hpctrain": HPCTRAIN,
        },
    }
    (config / "clusters" / "otp.yaml").write_text(yaml.safe_dump(profile))
    remote_clusters = login.home / "config" / "clusters"
    remote_clusters.mkdir(parents=True, exist_ok=True)
    (remote_clusters / "otp.yaml").write_text(yaml.safe_dump({"scheduler": "local"}))
    sockets = Path(str(login.dir)) / f"s{len(list(login.dir.glob('s*')))}"
    return {
        **os.environ,
        "HPCTRAIN_CONFIG_DIR": str(config),
        "HPCTRAIN_SSH_DIR": str(sockets),
        "XDG_STATE_HOME": str(tmp_path / "state"),
    }


def hpctrain(
    env: dict[str, str], *args: str, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", *args],
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,  # no terminal: a command that wanted a prompt would fail, not wait
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def started(env: dict[str, str], *args: str, cwd: Path | None = None) -> subprocess.Popen[str]:
    """``hpctrain ARGS`` started on "the laptop", its output piped (a command the test cuts mid-way)."""
    argv = [sys.executable, "-m", "hpctrain", *args]
    pipe = subprocess.PIPE
    return subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=pipe, stderr=pipe, text=True)


def wait_while(proc: subprocess.Popen[str], condition: Callable[[], bool], timeout_s: float = 120) -> None:
    """Wait while ``condition`` holds; fail with the command's output if it ended first or ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while condition():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)


def project(tmp_path: Path, login: OtpLogin) -> tuple[Path, str]:
    """A project folder whose name has a space and a quote, with a spec whose name has both too."""
    folder = tmp_path / "my project's code"
    (folder / "code").mkdir(parents=True)
    (folder / "code" / "train it.py").write_text(SCRIPT)
    spec = {
        "name": "remote_hello",
        "cluster": "otp",
        "output_dir": str(login.home / "runs dir"),
        "resources": {"nodes": 1, "tasks_per_node": 1, "time": "00:10:00"},
        "script": {"path": "code/train it.py", "args": ["it's", "a b"]},
        "env": {"COUNT_FILE": str(folder.parent / "count"), "HOLD_FILE": str(folder.parent / "hold")},
    }
    (folder / "job 'one'.yaml").write_text(yaml.safe_dump(spec))
    return folder, "job 'one'.yaml"


def hold(folder: Path, held: bool) -> None:
    """While held, the project's job stays up once started (the test cuts the command that runs it)."""
    path = folder.parent / "hold"
    path.write_text("") if held else path.unlink()


def runs(env: dict[str, str]) -> list[dict]:
    done = hpctrain(env, "status", "--all", "--json", "--cluster", "otp")
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    return listed if isinstance(listed, list) else listed.get("runs", [])


def test_one_prompt_for_a_whole_sitting_of_verbs(login: OtpLogin, laptop: dict[str, str], tmp_path: Path) -> None:
    before = login.prompts()
    code, shown = login_with_code(laptop, login)
    assert code == 0, shown
    assert "connected to 127.0.0.1" in shown and login.prompts() == before + 1
    socket_dir = Path(laptop["HPCTRAIN_SSH_DIR"])
    assert socket_dir.stat().st_mode & 0o777 == 0o700

    folder, spec = project(tmp_path, login)
    done = hpctrain(laptop, "submit", spec, "--cluster", "otp", cwd=folder)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (folder.parent / "count").read_text() == "ran\n"
    listed = runs(laptop)
    [run] = [r for r in listed if "remote_hello" in json.dumps(r)]
    run_dir = run.get("run_dir") or run.get("path")
    assert run_dir and " " in run_dir, run
    logs = hpctrain(laptop, "logs", run_dir, "--cluster", "otp")
    assert logs.returncode == 0, logs.stderr
    assert "hello from the login node: [\"it's\", 'a b']" in logs.stdout, logs.stdout
    status = hpctrain(laptop, "status", run_dir, "--cluster", "otp")
    assert status.returncode == 0 and "completed" in status.stdout.lower(), status.stdout + status.stderr
    follow = hpctrain(laptop, "logs", "-f", run_dir, "--cluster", "otp")
    assert follow.returncode == 0 and "hello from the login node" in follow.stdout, follow.stderr
    watch = hpctrain(laptop, "status", run_dir, "--watch", "--cluster", "otp")  # an ended run: one frame, then done
    assert watch.returncode == 0 and "completed" in watch.stdout.lower(), watch.stdout + watch.stderr
    report = hpctrain(laptop, "report", run_dir, "--cluster", "otp", "--out", str(tmp_path / "my report"))
    assert report.returncode == 0, report.stdout + report.stderr
    assert (tmp_path / "my report" / "report.md").is_file() and "copied to" in report.stdout
    stages = set((login.home / "hpctrain-submits").iterdir())
    doctor = hpctrain(laptop, "doctor", spec, "--cluster", "otp", cwd=folder)  # reads the spec there
    assert doctor.returncode == 0 and "train it.py is there" in doctor.stdout, doctor.stdout + doctor.stderr
    assert set((login.home / "hpctrain-submits").iterdir()) == stages, "its shipped copy is dropped after"
    first, again = (hpctrain(laptop, "cancel", run_dir, "--cluster", "otp") for _ in range(2))
    assert first.returncode == again.returncode and "Traceback" not in first.stderr + again.stderr
    assert login.prompts() == before + 1, "every verb went through the one connection"


def test_a_submit_cut_mid_way_and_retried_runs_once(login: OtpLogin, laptop: dict[str, str], tmp_path: Path) -> None:
    assert login_with_code(laptop, login)[0] == 0
    folder, spec = project(tmp_path, login)
    count = folder.parent / "count"
    hold(folder, True)
    first = started(laptop, "submit", spec, "--cluster", "otp", cwd=folder)
    wait_while(first, lambda: not count.exists())  # the job started on the login node: now the connection drops
    closed = hpctrain(laptop, "login", "otp", "--close")
    assert closed.returncode == 0, closed.stderr
    out, err = first.communicate(timeout=60)
    assert first.returncode != 0 and "Traceback" not in err, out + err
    hold(folder, False)  # the job on the login node, if it still runs, may end now

    assert login_with_code(laptop, login)[0] == 0  # the user logs in again (a new connection: a new code)
    retry = hpctrain(laptop, "submit", spec, "--cluster", "otp", cwd=folder)
    assert retry.returncode == 0, retry.stdout + retry.stderr
    assert "retrying submit" in retry.stdout and "hello" not in retry.stderr
    assert count.read_text() == "ran\n", "one job, not two"
    # The answer arrived: the same command again is a new submit.
    third = hpctrain(laptop, "submit", spec, "--cluster", "otp", cwd=folder)
    assert third.returncode == 0 and "retrying" not in third.stdout
    assert count.read_text() == "ran\nran\n"


def test_a_resume_cut_mid_way_and_retried_resumes_once_and_cancel_twice_is_harmless(
    login: OtpLogin, laptop: dict[str, str], tmp_path: Path
) -> None:
    assert login_with_code(laptop, login)[0] == 0
    folder, spec = project(tmp_path, login)
    count = folder.parent / "count"
    submitted = hpctrain(laptop, "submit", spec, "--cluster", "otp", cwd=folder)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    run_dir = submitted.stdout.split("run dir: ", 1)[1].splitlines()[0].strip()
    hold(folder, True)
    first = started(laptop, "resume", run_dir, "--cluster", "otp")
    wait_while(first, lambda: count.read_text().count("ran") < 2)  # the resumed attempt runs: the connection drops
    assert hpctrain(laptop, "login", "otp", "--close").returncode == 0
    out, err = first.communicate(timeout=60)
    assert first.returncode != 0 and "Traceback" not in err, out + err

    before = login.prompts()
    assert login_with_code(laptop, login)[0] == 0
    cancels = [hpctrain(laptop, "cancel", run_dir, "--cluster", "otp") for _ in range(2)]
    assert [c.returncode for c in cancels] == [0, 0], [c.stdout + c.stderr for c in cancels]
    assert "already" in cancels[1].stdout + cancels[1].stderr and "Traceback" not in cancels[0].stderr
    hold(folder, False)
    retry = hpctrain(laptop, "resume", run_dir, "--cluster", "otp")
    assert "retrying resume" in retry.stdout and "Traceback" not in retry.stderr, retry.stdout + retry.stderr
    assert count.read_text() == "ran\nran\n", "one resume, not two"
    assert login.prompts() == before + 1


def test_prune_through_the_connection_and_after_each_submit(
    login: OtpLogin, laptop: dict[str, str], tmp_path: Path
) -> None:
    assert login_with_code(laptop, login)[0] == 0
    root = login.home / "hpctrain-submits"
    root.mkdir(exist_ok=True)
    old, never_run = root / ("a" * 24), root / ("b" * 24)
    for stage in (old, never_run):
        (stage / "tree").mkdir(parents=True)
    (old / "claim").mkdir()
    (old / "rc").write_text("0\n")
    for path in (old / "rc", old, never_run):
        os.utime(path, (time.time() - 9 * 86400,) * 2)
    (root / "their notes").mkdir(exist_ok=True)
    before = login.prompts()
    dry = hpctrain(laptop, "remote", "prune", "--dry-run", "--cluster", "otp")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert f"{'a' * 24}: would drop its tree" in dry.stdout and f"{'b' * 24}: would drop" in dry.stdout, dry.stdout
    assert (old / "tree").is_dir() and never_run.is_dir()
    folder, spec = project(tmp_path, login)
    assert hpctrain(laptop, "submit", spec, "--cluster", "otp", cwd=folder).returncode == 0
    assert not (old / "tree").exists() and (old / "rc").is_file(), "a submit prunes by the default policy"
    assert not never_run.exists() and (root / "their notes").is_dir()
    assert login.prompts() == before


# The Python face from the laptop: each call's result (or error) as JSON, and whether torch was imported.
API_SITTING = """import json, sys, hpctrain
from hpctrain.errors import HpctrainError
said = {}
def call(name, make):
    try:
        said[name] = make()
    except HpctrainError as exc:
        said[name] = {"error": type(exc).__name__, "message": exc.message, "hint": exc.hint}
        return None
    return said[name]
if sys.argv[1] == "closed":
    call("status", lambda: hpctrain.status("/nowhere", cluster="otp").status)
else:
    made = call("submit", lambda: hpctrain.submit(sys.argv[2], cluster="otp"))
    said["submit"] = {"run_dir": str(made.run_dir), "backend": made.backend, "job_id": made.job_id}
    run = said["submit"]["run_dir"]
    call("status", lambda: hpctrain.status(run, cluster="otp").status)
    call("cancel", lambda: hpctrain.cancel(run, cluster="otp").already_ended)
    call("resume", lambda: hpctrain.resume("/nowhere/run", cluster="otp"))
said["torch"] = "torch" in sys.modules
print(json.dumps(said))
"""


def test_the_python_api_through_the_login_node(login: OtpLogin, laptop: dict[str, str], tmp_path: Path) -> None:
    folder, spec = project(tmp_path, login)
    hpctrain(laptop, "login", "otp", "--close")
    before = login.prompts()

    def sitting(*args: str) -> dict:
        done = subprocess.run(
            [sys.executable, "-c", API_SITTING, *args],
            env=laptop,
            cwd=folder,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout.splitlines()[-1])

    closed = sitting("closed")
    assert closed["status"]["error"] == "RemoteError" and "hpctrain login otp" in closed["status"]["hint"], closed
    assert login.prompts() == before, "a library call never prompts"
    assert login_with_code(laptop, login)[0] == 0
    said = sitting("open", spec)
    assert said["submit"]["backend"] == "local" and " " in said["submit"]["run_dir"], said
    assert (folder.parent / "count").read_text() == "ran\n"
    assert said["status"] == "completed" and said["cancel"] is True, said
    assert said["resume"]["error"] == "UsageError", said
    assert said["resume"]["message"].startswith("otp: "), said
    assert said["torch"] is False
    assert login.prompts() == before + 1


def test_a_dead_master_is_said_at_once_with_the_command_to_open_one(login: OtpLogin, laptop: dict[str, str]) -> None:
    hpctrain(laptop, "login", "otp", "--close")
    before = login.prompts()
    started = time.monotonic()
    done = hpctrain(laptop, "status", "--all", "--cluster", "otp")
    assert done.returncode == 6 and "hpctrain login otp" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and time.monotonic() - started < 30
    assert login.prompts() == before, "no prompt, no hang"
    check = hpctrain(laptop, "login", "otp", "--check")
    assert check.returncode == 1 and "not connected" in check.stdout


def test_at_a_terminal_a_command_opens_the_connection_itself_once(login: OtpLogin, laptop: dict[str, str]) -> None:
    hpctrain(laptop, "login", "otp", "--close")
    before = login.prompts()
    code, shown = on_terminal(laptop, login, "status", "--all", "--cluster", "otp")
    assert code == 0 and "opening the one connection to otp" in shown, shown
    assert login.prompts() == before + 1
    code, shown = on_terminal(laptop, login, "status", "--all", "--cluster", "otp")  # a terminal there too (-tt)
    assert code == 0 and "assword" not in shown and login.prompts() == before + 1, shown


@pytest.mark.parametrize("known", ["changed", "unknown"])
def test_an_unknown_or_changed_host_key_is_refused(login: OtpLogin, laptop: dict[str, str], known: str) -> None:
    hpctrain(laptop, "login", "otp", "--close")
    login.trust("AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl" if known == "changed" else None)
    before = login.prompts()
    code, shown = login_with_code(laptop, login)
    assert code == 6, shown
    assert ("CHANGED" if known == "changed" else "not known") in shown and "known_hosts" in shown, shown
    assert login.prompts() == before, "no code was asked of a host we do not trust"
    login.trust(login.host_key())


def test_a_login_node_without_hpctrain_is_said_with_the_fix(login: OtpLogin, laptop: dict[str, str]) -> None:
    profile_path = Path(laptop["HPCTRAIN_CONFIG_DIR"]) / "clusters" / "otp.yaml"
    profile = yaml.safe_load(profile_path.read_text())
    profile["login"]["hpctrain"] = "/nowhere/bin/hpctrain"
    profile_path.write_text(yaml.safe_dump(profile))
    code, shown = login_with_code(laptop, login)
    assert code == 6, shown
    assert "no hpctrain on the login node" in shown and "pip install" in shown and "login.hpctrain" in shown, shown
    hpctrain(laptop, "login", "otp", "--close")
