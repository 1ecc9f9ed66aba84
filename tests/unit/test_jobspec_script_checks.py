"""A ``script:`` section through ``load_job``: every bad input of issue 27 is a spec error with its key and line,
all reported at once, before anything is queued (hpctrain/jobspec/script_checks.py, models.Script)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from hpctrain.errors import SpecError
from hpctrain.jobspec.load import load_job
from hpctrain.jobspec.script_checks import module_file
from hpctrain.launch.script_code import require_program

pytestmark = pytest.mark.usefixtures("isolated")  # relative paths are read from where hpctrain runs (tmp_path)


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    path = tmp_path / "job.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def problems(path: Path) -> dict[str, str]:
    """Every problem ``validate`` reports: the spec's, then (when it loads) a missing script or module."""
    with pytest.raises(SpecError) as caught:
        require_program(load_job(path))
    return {problem.key: problem.message for problem in caught.value.problems}


def test_a_good_script_spec_resolves_its_path_and_needs_no_data_root(tmp_path: Path) -> None:
    job = load_job(
        write(
            tmp_path,
            """
            name: s
            resources: {nodes: 2, tasks_per_node: 4}
            script:
              path: train.py
              args: ["--dist-url", "tcp://{master_addr}:{master_port}", "--rank", "{rank}", "{{literal}}"]
            """,
        )
    )
    spec = job.spec
    assert spec.script is not None and spec.script.path == str(tmp_path / "train.py")
    assert (spec.runs_trainer, spec.world_size, spec.slurm_tasks_per_node) == (False, 8, 4)
    assert spec.script.args[-1] == "{{literal}}", "arguments are kept verbatim"


def test_every_bad_input_of_the_issue_at_once(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        name: s
        entrypoint: pkg.mod:main
        launcher: torchrun
        script:
          path: missing.py
          per: node
          args: [4, "{rnak}", "--rank={rank}", true, "{"]
        """,
    )
    found = problems(path)
    assert 'must be a string: quote it in YAML, "4"' in found["script.args.0"]
    assert "unknown placeholder {rnak}" in found["script.args.1"] and "{master_addr}" in found["script.args.1"]
    assert "got bool true" in found["script.args.3"]
    assert "lone '{'" in found["script.args.4"]
    # the cross-field checks need a valid section first: the same spec with the args fixed
    path.write_text(path.read_text().replace('[4, "{rnak}", "--rank={rank}", true, "{"]', '["--rank={rank}"]'))
    found = problems(path)
    assert "two ways to run your code" in found["script"]
    assert "launcher: torchrun starts the workers itself" in found["script.per"]
    assert "per: node starts one process per node, which has no rank" in found["script.args.0"]
    path.write_text(path.read_text().replace("entrypoint: pkg.mod:main", "").replace("launcher: torchrun", ""))
    path.write_text(path.read_text().replace('["--rank={rank}"]', '["--rank={node_rank}"]'))
    assert f"{tmp_path / 'missing.py'} does not exist" in problems(path)["script.path"]


def test_a_runs_own_spec_loads_after_its_script_moved(tmp_path: Path) -> None:
    """resume loads RUN_DIR/spec.yaml, whose script path may be gone: every attempt runs the run's copy."""
    path = write(tmp_path, "name: s\nscript: {path: train.py}\n")
    (tmp_path / "train.py").unlink()
    assert load_job(path).spec.script is not None


def test_problems_carry_their_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        name: s
        script:
          path: train.py
          args:
            - "--ok"
            - "{rnak}"
        """,
    )
    with pytest.raises(SpecError) as caught:
        load_job(path)
    [problem] = caught.value.problems
    assert (problem.key, problem.line) == ("script.args.1", 7)


@pytest.mark.parametrize(
    ("section", "key", "needle"),
    [
        ("{path: train.py, module: pkg.train}", "script", "exactly one of path"),
        ("{args: []}", "script", "exactly one of path"),
        ("{module: 'not a module'}", "script.module", "is not a module name"),
        ("{module: no_such_module_anywhere.train}", "script.module", "is not found from here"),
        ("{path: .}", "script.path", "is not a regular file"),
        ("{path: train.py, stop_signal: USR2}", "script.stop_signal", "'USR2' is not allowed"),
        ("{path: train.py, workdir: 'out/{rnak}'}", "script.workdir", "unknown placeholder"),
        ("{path: train.py, silence_timeout_s: -1}", "script.silence_timeout_s", "greater than or equal to 0"),
    ],
)
def test_bad_script_sections(tmp_path: Path, section: str, key: str, needle: str) -> None:
    found = problems(write(tmp_path, f"name: s\nscript: {section}\n"))
    assert needle in found[key], found


def test_the_stop_signal_and_timeout_against_the_time_limit_warning(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        name: s
        signals: {timeout_signal: USR1, signal_delay_s: 30}
        script: {path: train.py, stop_signal: USR1, stop_timeout_s: 20}
        """,
    )
    found = problems(path)
    assert "also signals.timeout_signal" in found["script.stop_signal"] and "(TERM, INT)" in found["script.stop_signal"]
    assert "use at most 15" in found["script.stop_timeout_s"]


def test_entrypoint_args_belong_to_entrypoints(tmp_path: Path) -> None:
    found = problems(write(tmp_path, "name: s\nentrypoint_args: {a: 1}\nscript: {path: train.py}\n"))
    assert "give a script its options in script.args" in found["entrypoint_args"]


def test_sweep_parameters_of_a_script(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        name: s
        script: {path: train.py, args: ["--lr", "{sweep.lr}", "--seed={sweep.seed}", "{rank}"]}
        sweep: {lr: [0.1, 0.01], seed: [1], env.SEED: ["a"]}
        """,
    )
    job = load_job(path)
    assert [trial.script.args[:3] for trial in job.trials] == [
        ["--lr", "0.1", "--seed=1"],
        ["--lr", "0.01", "--seed=1"],
    ]
    assert all(trial.script.args[3] == "{rank}" for trial in job.trials), "the nodes fill the rest"
    assert [trial.env for trial in job.trials] == [{"SEED": "a"}] * 2, "a spec key is still set in the spec"
    assert job.trial_params[0] == {"lr": 0.1, "seed": 1, "env.SEED": "a"}


def test_sweep_placeholders_must_name_a_swept_key_and_script_parameters_must_be_used(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        name: s
        script: {path: train.py, args: ["{sweep.lr}", "{sweep.momentum}"]}
        sweep: {lr: [0.1], batch: [8, 16]}
        """,
    )
    found = problems(path)
    assert "the spec sweeps only batch, lr" in found["script.args.1"]
    assert "no script argument uses it" in found["sweep.batch"]
    found = problems(write(tmp_path, 'name: s\nscript: {path: train.py, args: ["{sweep.lr}"]}\n'))
    assert "the spec sweeps nothing" in found["script.args.0"]


def test_module_file_finds_a_module_without_importing_it(tmp_path: Path) -> None:
    package = tmp_path / "mypkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("raise SystemExit('imported!')\n")
    (package / "train.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "__main__.py").write_text("")
    assert module_file("mypkg.train", [str(tmp_path)]) == package / "train.py"
    assert module_file("mypkg.sub", [str(tmp_path)]) == package / "sub" / "__main__.py"
    assert module_file("mypkg", [str(tmp_path)]) is None, "a package without __main__ cannot run"
    assert module_file("mypkg.nope", [str(tmp_path)]) is None
    assert module_file("json.tool") is not None


def test_eviction_is_refused_for_a_script_and_auto_is_off(tmp_path: Path) -> None:
    text = """
        name: s
        resources: {nodes: 2, spare_nodes: 1, tasks_per_node: 2}
        health: {eviction: {enabled: EVICT}}
        script: {path: train.py}
        """
    found = problems(write(tmp_path, text.replace("EVICT", "true")))
    assert "compute times" in found["health.eviction.enabled"]
    job = load_job(write(tmp_path, text.replace("EVICT", "auto")))
    assert job.spec.resources.heals and not job.spec.evicts, "a script reports no compute times to judge"


@pytest.mark.parametrize("link", ["loop", "through a loop", "dangling"])
def test_a_script_path_that_is_a_broken_link_says_which(link: str, tmp_path: Path) -> None:
    """A loop once crashed validate/--dry-run/--local with RuntimeError; now each names what it is."""
    (tmp_path / "l1").symlink_to(tmp_path / "l2")
    (tmp_path / "l2").symlink_to(tmp_path / "l1")
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere.py")
    path = {"loop": "l1", "through a loop": "l1/train.py", "dangling": "gone"}[link]
    spec = write(tmp_path, f"name: s\nscript: {{path: {path}}}\n")
    found = problems(spec)["script.path"]
    assert ("symlink loop" in found) if link != "dangling" else ("nowhere.py" in found and "not exist" in found)


def test_a_missing_script_is_reported_with_the_specs_other_mistakes(tmp_path: Path) -> None:
    """'Every mistake at once': a schema error elsewhere no longer hides the missing file (validate, submit)."""
    from hpctrain.launch.plan import validate

    path = write(tmp_path, "name: s\nresources: {nodes: 0, time: 90}\nscript: {path: nope.py, per: sometimes}\n")
    with pytest.raises(SpecError) as caught:
        validate(path)
    found = {problem.key: (problem.line, problem.message) for problem in caught.value.problems}
    assert set(found) == {"resources.nodes", "script.per", "script.path"}
    assert found["script.path"] == (3, f"{tmp_path / 'nope.py'} does not exist (a relative path is read "
                                    f"from where you run hpctrain, {tmp_path})")  # fmt: skip
    assert load_job(write(tmp_path, "name: s\nscript: {path: gone.py}\n")).spec.script is not None  # resume's load


def test_validate_says_the_time_limits_unit(tmp_path: Path) -> None:
    from hpctrain.launch.plan import limit_words, validate

    assert (
        "time 90 (1 h 30 min)"
        in validate(write(tmp_path, "name: s\nresources: {time: 90}\nscript: {path: train.py}\n")).summary
    )
    assert (limit_words(86400 + 61), limit_words(1800)) == ("1 d 1 min 1 s", "30 min")
