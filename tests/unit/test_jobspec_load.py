"""The spec loader: every kind of bad input becomes a SpecError whose problems
name the key, the position and the fix; good input resolves against its
cluster profile, its ``--set`` overrides and the working directory.

Everything runs in-process against ``load_job``; the CLI wrapping is covered
by test_cli_main.py.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from hpctrain.errors import SpecError, SpecProblem
from hpctrain.jobspec.cross_checks import check_resolved
from hpctrain.jobspec.load import load_job, parse_override
from hpctrain.jobspec.models import JobSpec
from hpctrain.jobspec.profiles import BUILTIN_PROFILES, apply_profile
from hpctrain.jobspec.slurm_time import parse_time_limit, seconds_to_minutes
from hpctrain.jobspec.yaml_source import dump_yaml

REPO = Path(__file__).resolve().parents[2]
VALID = """\
name: job
data:
  root: /datasets/imagenet
"""


pytestmark = pytest.mark.usefixtures("isolated")


def write(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def spec_error(path: Path, overrides: tuple[str, ...] = (), **kwargs: object) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_job(path, overrides, **kwargs)  # type: ignore[arg-type]
    return info.value


def only_problem(error: SpecError) -> SpecProblem:
    assert len(error.problems) == 1, error.message
    return error.problems[0]


def problem_at(error: SpecError, key: str) -> SpecProblem:
    matches = [p for p in error.problems if p.key == key]
    assert matches, f"no problem at {key!r} in:\n{error.message}"
    return matches[0]


# ---------------------------------------------------------------- whole-file problems


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    error = spec_error(tmp_path / "nope.yaml")
    assert error.source.endswith("nope.yaml")
    assert "not found" in only_problem(error).message
    assert error.hint


def test_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    error = spec_error(tmp_path / "jobs")
    assert "directory" in only_problem(error).message
    assert "jobs/" in (error.hint or "")


def test_binary_garbage_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "garbage.yaml"
    path.write_bytes(bytes(range(256)) * 4)
    assert "binary" in only_problem(spec_error(path)).message


def test_non_utf8_text_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\xe9\n".encode("latin-1"))
    error = spec_error(path)
    assert "UTF-8" in only_problem(error).message
    assert "UTF-8" in (error.hint or "")


@pytest.mark.parametrize(
    ("text", "line", "column"),
    [
        ("name: a\n  bad: 1\n", 2, 6),  # a mapping value where a scalar continues
        ('name: "a\n', 2, 1),  # unterminated quote
        ("name: a\nresources:\n\tnodes: 1\n", 3, 1),  # a tab
        ("name: a\nresources: {nodes: 1\n", 3, 1),  # unclosed flow mapping
    ],
)
def test_invalid_yaml_gives_line_and_column(tmp_path: Path, text: str, line: int, column: int) -> None:
    problem = only_problem(spec_error(write(tmp_path, text)))
    assert problem.message.startswith("invalid YAML")
    assert (problem.line, problem.column) == (line, column)


@pytest.mark.parametrize(
    ("text", "kind"),
    [("- name: a\n- name: b\n", "list"), ("just a sentence\n", "str"), ("42\n", "int")],
)
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str, kind: str) -> None:
    error = spec_error(write(tmp_path, text))
    assert f"top level is a {kind}" in only_problem(error).message
    assert "name:" in (error.hint or "")


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n"])
def test_empty_file(tmp_path: Path, text: str) -> None:
    error = spec_error(write(tmp_path, text))
    assert "empty" in only_problem(error).message
    assert "hpctrain init" in (error.hint or "")


@pytest.mark.parametrize(
    "tagged",
    [
        "!!python/object/apply:os.system ['touch pwned']",
        "!!python/name:os.system",
        "!!python/object/new:subprocess.Popen [['touch', 'pwned']]",
        "!custom thing",
    ],
)
def test_yaml_tags_never_construct_objects(tmp_path: Path, tagged: str) -> None:
    problem = only_problem(spec_error(write(tmp_path, f"name: a\nentrypoint_args:\n  x: {tagged}\n")))
    assert "tag not allowed" in problem.message
    assert "remove the tag" in problem.message
    assert (problem.line, problem.column) == (3, 6)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    ("text", "key", "line", "first"),
    [
        ("name: a\nname: b\n", "name", 2, 1),
        ("name: a\nresources:\n  nodes: 1\n  time: '1:00'\n  nodes: 2\n", "nodes", 5, 3),
    ],
)
def test_duplicate_keys_are_refused(tmp_path: Path, text: str, key: str, line: int, first: int) -> None:
    problem = only_problem(spec_error(write(tmp_path, text)))
    assert f"duplicate key {key!r}" in problem.message
    assert f"first defined on line {first}" in problem.message
    assert problem.line == line


def test_unknown_keys_at_every_depth_suggest_the_closest(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        name: a
        resources:
          nodez: 2
        trainer:
          learning_rate: 0.1
        distributed:
          time_out_s: 60
        checkpoints:
          keep_last: 3
        """,
    )
    error = spec_error(path)
    cases = {
        "resources.nodez": ("nodes", 3),
        "trainer.learning_rate": ("label_smoothing", 5),  # difflib's pick; the valid list follows
        "distributed.time_out_s": ("timeout_s", 7),
        "checkpoints": ("checkpoint", 8),
    }
    for key, (closest, line) in cases.items():
        problem = problem_at(error, key)
        assert "unknown key" in problem.message
        assert problem.line == line
        if key != "trainer.learning_rate":
            assert f"did you mean '{closest}'" in problem.message
    assert "lr" in problem_at(error, "trainer.learning_rate").message.split("valid keys here: ")[1].split(", ")
    assert "(valid keys here: account, array_parallelism" in problem_at(error, "resources.nodez").message


@pytest.mark.parametrize(
    ("section", "value", "key", "needle"),
    [
        ("resources", "nodes: two", "resources.nodes", "valid integer"),
        ("resources", "exclusive: maybe", "resources.exclusive", "valid boolean"),
        ("resources", "time: [1, 2]", "resources.time", "time must be a string"),
        ("trainer", "lr: fast", "trainer.lr", "valid number"),
        ("trainer", "epochs: 1.5", "trainer.epochs", "valid integer (got float 1.5)"),
        ("trainer", "strategy: fsdp", "trainer.strategy", "choose one of 'single', 'dp', 'ddp'"),
        ("trainer", "precision: fp8", "trainer.precision", "choose one of 'fp32', 'fp16', 'bf16'"),
        ("trainer", "step_epochs: 30", "trainer.step_epochs", "valid list"),
        ("data", "root: [a]", "data.root", "valid string"),
        ("distributed", "backend: mpi", "distributed.backend", "'auto', 'nccl' or 'gloo'"),
        ("signals", "timeout_signal: TERM", "signals.timeout_signal", "'USR1' or 'USR2'"),
    ],
)
def test_wrong_types_name_the_key_and_what_is_allowed(
    tmp_path: Path, section: str, value: str, key: str, needle: str
) -> None:
    problem = problem_at(spec_error(write(tmp_path, f"name: a\n{section}:\n  {value}\n")), key)
    assert needle in problem.message
    assert problem.line is not None


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("setup: module load cuda", "setup"),
        ("env: [A, B]", "env"),
        ("env: {OMP_NUM_THREADS: [4]}", "env.OMP_NUM_THREADS"),
        ("sweep: [trainer.lr]", "sweep"),
        ("resources: 4", "resources"),
        ("name: 5", "name"),
    ],
)
def test_wrong_container_types(tmp_path: Path, text: str, key: str) -> None:
    header = "" if text.startswith("name:") else "name: a\n"
    problem = problem_at(spec_error(write(tmp_path, header + text + "\n")), key)
    assert "(got " in problem.message


@pytest.mark.parametrize(
    ("section", "value", "key"),
    [("resources", "nodes: true", "resources.nodes"), ("trainer", "lr: yes", "trainer.lr")],
)
def test_booleans_are_not_numbers(tmp_path: Path, section: str, value: str, key: str) -> None:
    problem = problem_at(spec_error(write(tmp_path, f"{VALID}{section}:\n  {value}\n")), key)
    assert "(got bool True)" in problem.message


@pytest.mark.parametrize(
    ("section", "value", "key", "needle"),
    [
        ("resources", "nodes: 0", "resources.nodes", "greater than or equal to 1"),
        ("resources", "nodes: -4", "resources.nodes", "greater than or equal to 1"),
        ("resources", "gpus_per_node: -1", "resources.gpus_per_node", "greater than or equal to 0"),
        ("resources", "tasks_per_node: 0", "resources.tasks_per_node", "greater than or equal to 1"),
        ("resources", "cpus_per_task: 0", "resources.cpus_per_task", "greater than or equal to 1"),
        ("resources", "mem_gb: 0", "resources.mem_gb", "greater than 0"),
        ("resources", "array_parallelism: 0", "resources.array_parallelism", "greater than or equal to 1"),
        ("trainer", "batch_size: 0", "trainer.batch_size", "greater than or equal to 1"),
        ("trainer", "epochs: 0", "trainer.epochs", "greater than or equal to 1"),
        ("trainer", "lr: 0", "trainer.lr", "greater than 0"),
        ("trainer", "lr: -0.1", "trainer.lr", "greater than 0"),
        ("trainer", "momentum: 1.0", "trainer.momentum", "less than 1"),
        ("data", "workers: -1", "data.workers", "greater than or equal to 0"),
        ("data", "image_size: 0", "data.image_size", "greater than or equal to 8"),
        ("checkpoint", "keep_last: 0", "checkpoint.keep_last", "greater than or equal to 1"),
        ("distributed", "master_port: 80", "distributed.master_port", "greater than or equal to 1024"),
        ("signals", "signal_delay_s: 0", "signals.signal_delay_s", "greater than or equal to 10"),
    ],
)
def test_negative_or_zero_sizes(tmp_path: Path, section: str, value: str, key: str, needle: str) -> None:
    path = write(tmp_path, f"name: a\n{section}:\n  {value}\n")
    problem = problem_at(spec_error(path), key)
    assert needle in problem.message
    assert "(got " in problem.message
    assert problem.line == 3


def test_unknown_cluster_lists_the_profiles_and_where_to_add_one(tmp_path: Path, isolated: Path) -> None:
    problem = only_problem(spec_error(write(tmp_path, VALID + "cluster: halx\n")))
    assert problem.key == "cluster"
    assert problem.line == 4
    assert "unknown cluster profile 'halx'" in problem.message
    assert "available: hal, local, slurm" in problem.message
    assert str(isolated / "clusters" / "halx.yaml") in problem.message


def test_every_problem_is_reported_at_once_in_file_order(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        name: "has spaces"
        cluster: nowhere
        resources:
          nodes: 0
          time: "1 day"
          gpus: 4
        trainer:
          strategy: fsdp
          batch_size: -8
        data:
          workers: many
        """,
    )
    error = spec_error(path)
    keys = [p.key for p in error.problems]
    assert set(keys) == {
        "name",
        "cluster",
        "resources.nodes",
        "resources.time",
        "resources.gpus",
        "trainer.strategy",
        "trainer.batch_size",
        "data.workers",
    }
    lines = [p.line for p in error.problems]
    assert lines == sorted(lines)
    assert f"{len(keys)} problems" in error.message
    for problem in error.problems:  # each rendered as FILE:LINE:COL: KEY: message
        assert f"{path}:{problem.line}:{problem.column}: {problem.key}: " in error.message


@pytest.mark.parametrize(
    "line", ["echo a; rm -rf ~", "true && curl x", "cat x | sh", "echo $(id)", "echo `id`", "echo > /etc/x", "a\nb"]
)
def test_setup_lines_cannot_chain_commands(tmp_path: Path, line: str) -> None:
    text = VALID + "setup:\n  - module load cuda\n  - " + json.dumps(line) + "\n"
    problem = only_problem(spec_error(write(tmp_path, text)))
    assert problem.key == "setup.1"  # the line itself
    assert "one command" in problem.message
    assert "source" in problem.message


def _yaml_str(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def test_plain_setup_lines_are_fine(tmp_path: Path) -> None:
    setup = ["module load cuda/12.1", "source /opt/envs/train/bin/activate", "export OMP_NUM_THREADS=4"]
    text = VALID + "setup:\n" + "".join(f"  - {_yaml_str(s)}\n" for s in setup)
    assert load_job(write(tmp_path, text)).spec.setup == setup


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("name: 'a b'", "name"),
        ("name: '$(id)'", "name"),
        ("env:\n  BAD-NAME: x", "env.BAD-NAME"),
        ('env:\n  A: "two\\nlines"', "env.A"),
        ("resources:\n  partition: 'gpu; rm -rf ~'", "resources.partition"),
        ("resources:\n  slurm_extra:\n    reservation: 'a b'", "resources.slurm_extra.reservation"),
        ("resources:\n  slurm_extra:\n    'x --y': z", "resources.slurm_extra.x --y"),
        ('output_dir: "/tmp/a\\nb"', "output_dir"),
        ("entrypoint: 'os:system; id'", "entrypoint"),
        ("distributed:\n  nccl_env:\n    LD_PRELOAD: /x.so", "distributed.nccl_env.LD_PRELOAD"),
    ],
)
def test_strings_that_could_reach_a_shell_are_checked(tmp_path: Path, text: str, key: str) -> None:
    base = "name: a\ndata:\n  root: /d\n"
    if text.startswith("name:"):
        base = "data:\n  root: /d\n"
    problem_at(spec_error(write(tmp_path, base + text + "\n")), key)


@pytest.mark.parametrize(
    ("text", "key", "needle"),
    [
        ("container: {runtime: apptainer, image: --writable-tmpfs}", "container.image", "not starting with '-'"),
        ("container: {runtime: pyxis, image: -x}", "container.image", "docker://ubuntu:22.04"),
        ("container: {runtime: apptainer, image: a.sif, python: -c}", "container.python", "/opt/conda/bin/python"),
        ("container: {runtime: apptainer, image: 'a b.sif'}", "container.image", "is not an image"),
        ("container: {runtime: apptainer, image: a.sif, mounts: [rel/x]}", "container.mounts.0", "SRC[:DST[:ro|rw]]"),
        ("container: {runtime: apptainer, image: a.sif, mounts: ['/a,/b']}", "container.mounts.0", "no ','"),
        ("resources: {partition: --wrap=id}", "resources.partition", "may not start with '-'"),
        ("container: {runtime: apptainer, image: a.sif, options: ['--nv; id']}", "container.options.0", "--no-privs"),
        ("container: {runtime: apptainer, image: a.sif, options: [nv]}", "container.options.0", "runtime flag"),
        ("container: {runtime: apptainer, image: a.sif, options: ['--env=A=$(id)']}", "container.options.0", "flag"),
        ("container: {runtime: apptainer, image: a.sif, options: [--drop-caps, X]}", "container.options.1", "'='"),
    ],
)
def test_command_line_words_refuse_a_leading_dash_and_say_what_is_allowed(
    tmp_path: Path, text: str, key: str, needle: str
) -> None:
    """An image of '--writable-tmpfs' became an option of 'apptainer exec'; each pattern had the
    job-name rule as its message (issue 19)."""
    problem = only_problem(spec_error(write(tmp_path, VALID + text + "\n")))
    assert problem.key == key and needle in problem.message, problem.message
    assert "at most 64" not in problem.message  # the job-name rule belongs to name: only


def test_every_bad_entry_of_a_mapping_or_list_is_reported_at_once(tmp_path: Path) -> None:
    text = VALID + textwrap.dedent(
        """\
        env: {GOOD: 1, bad-name: x, 1X: y, CTRL: "a\\nb"}
        setup: ["echo a; b", "module load x", "x | y"]
        resources:
          slurm_extra: {--foo: 1, mail-type: "a b", reservation: ok}
        distributed:
          nccl_env: {nccl_x: 1, NCCL_OK: "a\\tb", NCCL_DEBUG: INFO}
        """
    )
    found = {p.key: p.message for p in spec_error(write(tmp_path, text)).problems}
    assert set(found) == {
        "env.bad-name",
        "env.1X",
        "env.CTRL",
        "setup.0",
        "setup.2",
        "resources.slurm_extra.--foo",
        "resources.slurm_extra.mail-type",
        "distributed.nccl_env.nccl_x",
        "distributed.nccl_env.NCCL_OK",
    }
    assert "not a valid environment variable name" in found["env.1X"]
    assert "control characters" in found["env.CTRL"] and "control characters" in found["distributed.nccl_env.NCCL_OK"]
    assert "no leading --" in found["resources.slurm_extra.--foo"]
    assert "NCCL_*" in found["distributed.nccl_env.nccl_x"]


def test_every_pattern_of_specs_and_profiles_has_its_own_rule_in_words() -> None:
    from hpctrain.jobspec.fields import PATTERN_RULES
    from hpctrain.jobspec.profiles import ClusterProfile

    def patterns(node: object) -> set[str]:
        if isinstance(node, dict):
            found = {node["pattern"]} if isinstance(node.get("pattern"), str) else set()
            found |= set(node.get("patternProperties", {}))
            return found.union(*(patterns(value) for value in node.values()))
        if isinstance(node, list):
            return set().union(*(patterns(item) for item in node))
        return set()

    used = patterns(JobSpec.model_json_schema()) | patterns(ClusterProfile.model_json_schema())
    assert len(used) >= 9 and used <= set(PATTERN_RULES), used - set(PATTERN_RULES)


def test_a_pattern_without_its_own_rule_is_quoted_not_given_the_job_name_rule() -> None:
    from hpctrain.jobspec.problems import _describe

    error = {"type": "string_pattern_mismatch", "loc": ("x",), "msg": "", "input": "?", "ctx": {"pattern": "^a$"}}
    assert _describe(error, JobSpec) == "'?' does not match the pattern ^a$"


# ---------------------------------------------------------------- --set overrides


def test_set_nested_key_overrides_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, VALID + "trainer:\n  epochs: 90\n")
    job = load_job(path, ["trainer.epochs=5", "resources.nodes=2", "trainer.strategy=ddp"])
    assert job.spec.trainer.epochs == 5
    assert job.spec.resources.nodes == 2


def test_set_creates_missing_sections(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, VALID), ["checkpoint.keep_last=7", "distributed.nccl_env.NCCL_DEBUG=INFO"])
    assert job.spec.checkpoint.keep_last == 7
    assert job.spec.distributed.nccl_env == {"NCCL_DEBUG": "INFO"}


@pytest.mark.parametrize(
    ("override", "attribute", "expected"),
    [
        ("trainer.step_epochs=[10, 20]", ("trainer", "step_epochs"), [10, 20]),
        ("trainer.channels_last=true", ("trainer", "channels_last"), True),
        ("trainer.lr=1e-3", ("trainer", "lr"), 0.001),
        ("trainer.lr=.5", ("trainer", "lr"), 0.5),
        ("trainer.desired_acc=null", ("trainer", "desired_acc"), None),
        ("resources.time=24:00:00", ("resources", "time"), "24:00:00"),
        ("resources.time=2-00:00:00", ("resources", "time"), "2-00:00:00"),
        ("resources.time=90", ("resources", "time"), "90"),
        ("resources.slurm_extra={reservation: demo}", ("resources", "slurm_extra"), {"reservation": "demo"}),
        ("output_dir=/scratch/x=y", ("output_dir",), "/scratch/x=y"),  # only the first '=' splits
    ],
)
def test_set_values_are_read_as_yaml(
    tmp_path: Path, override: str, attribute: tuple[str, ...], expected: object
) -> None:
    job = load_job(write(tmp_path, VALID), [override])
    value: object = job.spec
    for part in attribute:
        value = getattr(value, part)
    assert value == expected
    assert type(value) is type(expected)


def test_time_in_the_file_stays_a_string_even_unquoted(tmp_path: Path) -> None:
    # YAML 1.1 would read 24:00:00 as the base-60 integer 86400.
    job = load_job(write(tmp_path, VALID + "resources:\n  time: 24:00:00\n"))
    assert job.spec.resources.time == "24:00:00"
    assert job.spec.resources.time_s == 86400


def test_set_with_wrong_type_is_blamed_on_the_override(tmp_path: Path) -> None:
    path = write(tmp_path, VALID + "resources:\n  nodes: 2\n")
    problem = only_problem(spec_error(path, ("resources.nodes=abc",)))
    assert problem.key == "resources.nodes"
    assert "(from --set)" in problem.message
    assert "valid integer" in problem.message
    assert problem.line is None  # the file's line 5 is not where the bad value came from


@pytest.mark.parametrize(
    ("override", "key", "needle"),
    [
        ("trainer.lrr=1", "trainer.lrr", "did you mean 'lr'"),
        ("resources.gpus=4", "resources.gpus", "did you mean 'gpus_per_node'"),
        ("trainers.lr=1", "trainers", "did you mean 'trainer'"),
        ("trainer.lr.x=1", "trainer.lr", "valid number"),
    ],
)
def test_set_unknown_key(tmp_path: Path, override: str, key: str, needle: str) -> None:
    problem = only_problem(spec_error(write(tmp_path, VALID), (override,)))
    assert problem.key == key
    assert needle in problem.message
    assert "(from --set)" in problem.message


@pytest.mark.parametrize("override", ["noequals", "=5", "trainer..lr=1", ".lr=1"])
def test_set_needs_key_equals_value(override: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_override(override)
    assert info.value.source == "--set"
    assert "KEY=VALUE" in info.value.problems[0].message
    assert "--set trainer.epochs=5" in (info.value.hint or "")


def test_set_inside_a_scalar_is_refused(tmp_path: Path) -> None:
    error = spec_error(write(tmp_path, VALID), ("name.first=x",))
    assert error.source == "--set"
    assert "'name' is not a section" in only_problem(error).message


def test_cluster_argument_overrides_the_spec(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, VALID + "cluster: local\n"), cluster="hal")
    assert job.profile.name == "hal"
    assert job.spec.resources.partition == "gpu"


# ---------------------------------------------------------------- Slurm time limits


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 30 * 60),  # M
        (90, 90 * 60),  # an unquoted YAML integer is minutes too
        ("30:15", 30 * 60 + 15),  # M:S
        ("24:00:00", 86400),  # H:M:S
        ("48:00:00", 2 * 86400),  # hours may exceed 24 without a day count
        ("2-12", 2 * 86400 + 12 * 3600),  # D-H
        ("1-02:30", 86400 + 2 * 3600 + 30 * 60),  # D-H:M
        ("1-02:03:04", 86400 + 2 * 3600 + 3 * 60 + 4),  # D-H:M:S
        (" 00:05:00 ", 300),
    ],
)
def test_slurm_time_forms(text: str | int, seconds: int) -> None:
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("0", "zero"),
        ("00:00:00", "zero"),
        ("0-0", "zero"),
        ("25:99:00", "minutes must be < 60"),
        ("10:60", "seconds must be < 60"),
        ("01:00:60", "seconds must be < 60"),
        ("1-24", "hours must be < 24"),
        ("1-24:00:00", "hours must be < 24"),
        ("1 day", "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"),
        ("24h", "not a Slurm time limit"),
        ("", "not a Slurm time limit"),
        ("-5", "not a Slurm time limit"),
        ("1.5", "not a Slurm time limit"),
        ("1:2:3:4", "not a Slurm time limit"),
        ("UNLIMITED", "not a Slurm time limit"),
    ],
)
def test_slurm_time_rejects(text: str, needle: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_time_limit(text)
    assert needle in str(info.value)


def test_bad_time_in_a_spec_names_the_allowed_forms(tmp_path: Path) -> None:
    problem = only_problem(spec_error(write(tmp_path, VALID + "resources:\n  time: 1 day\n")))
    assert problem.key == "resources.time"
    assert (problem.line, problem.column) == (5, 3)
    assert "HH:MM:SS" in problem.message


@pytest.mark.parametrize("seconds", [1, 59, 60, 3599, 86400, 90061, 10 * 86400])
def test_time_limits_are_whole_minutes_rounded_up(seconds: int) -> None:
    assert seconds_to_minutes(seconds) * 60 >= seconds > (seconds_to_minutes(seconds) - 1) * 60


# ---------------------------------------------------------------- cluster profiles


def test_hal_profile_fills_what_the_spec_leaves_out(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, "name: a\ncluster: hal\n"))
    res = job.spec.resources
    assert (res.partition, res.cpus_per_task, res.gpus_per_node) == ("gpu", 40, 4)
    assert job.spec.data.root == "/home/shared/imagenet/raw"
    assert job.spec.setup == ["module load opence"]
    assert job.spec.tasks_per_node == 4 and job.spec.world_size == 4


def test_spec_values_win_over_the_profile(tmp_path: Path) -> None:
    text = """\
    name: a
    cluster: hal
    setup: [module load cuda, module load opence]
    env: {NCCL_DEBUG: WARN}
    resources:
      partition: gpu-debug
      cpus_per_task: 8
      gpus_per_node: 2
      mem_gb: 64
    data:
      root: /scratch/imagenet
    """
    job = load_job(write(tmp_path, text))
    res = job.spec.resources
    assert (res.partition, res.cpus_per_task, res.gpus_per_node, res.mem_gb) == ("gpu-debug", 8, 2, 64)
    assert job.spec.data.root == "/scratch/imagenet"
    assert job.spec.setup == ["module load opence", "module load cuda"]  # profile first, no duplicate
    assert job.spec.env == {"NCCL_DEBUG": "WARN"}


def test_apply_profile_merges_env_and_slurm_extra_with_spec_winning() -> None:
    profile = BUILTIN_PROFILES["slurm"].model_copy(
        update={"env": {"A": "profile", "B": "profile"}, "slurm_extra": {"reservation": "p", "mail-type": "END"}}
    )
    spec = JobSpec.model_validate(
        {"name": "a", "env": {"B": "spec"}, "resources": {"slurm_extra": {"reservation": "s"}}}
    )
    merged = apply_profile(spec, profile)
    assert merged.env == {"A": "profile", "B": "spec"}
    assert merged.resources.slurm_extra == {"reservation": "s", "mail-type": "END"}
    assert spec.env == {"B": "spec"}  # the input is not modified


def write_profile(config: Path, name: str, text: str) -> Path:
    path = config / "clusters" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_user_profile_from_config_dir(tmp_path: Path, isolated: Path) -> None:
    write_profile(
        isolated,
        "delta",
        """\
        description: NCSA Delta A100 nodes
        partition: gpuA100x4
        account: bbka-delta-gpu
        gpus_per_node: 4
        max_gpus_per_node: 4
        gpu_gres: "gpu:a100:{gpus}"
        max_time: "48:00:00"
        data_root: /ime/imagenet
        setup: [module load pytorch]
        """,
    )
    job = load_job(write(tmp_path, "name: a\ncluster: delta\nresources:\n  time: '36:00:00'\n"))
    assert job.profile.name == "delta"  # taken from the file name
    res = job.spec.resources
    assert (res.partition, res.account, res.gpus_per_node) == ("gpuA100x4", "bbka-delta-gpu", 4)
    assert job.spec.data.root == "/ime/imagenet"
    assert job.spec.setup == ["module load pytorch"]
    error = spec_error(write(tmp_path, "name: a\ncluster: nope\n", "other.yaml"))
    assert "available: delta, hal, local, slurm" in only_problem(error).message


def test_user_profile_in_home_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPCTRAIN_CONFIG_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    write_profile(tmp_path / "home" / ".config" / "hpctrain", "mine", "partition: p100\n")
    assert load_job(write(tmp_path, VALID + "cluster: mine\n")).spec.resources.partition == "p100"


def test_environ_argument_selects_the_config_dir(tmp_path: Path) -> None:
    write_profile(tmp_path / "elsewhere", "mine", "partition: p100\n")
    environ = {"HPCTRAIN_CONFIG_DIR": str(tmp_path / "elsewhere")}
    job = load_job(write(tmp_path, VALID + "cluster: mine\n"), environ=environ)
    assert job.spec.resources.partition == "p100"


def test_user_profile_replaces_a_builtin(tmp_path: Path, isolated: Path) -> None:
    write_profile(isolated, "hal", "partition: gpu-new\ngpus_per_node: 8\nmax_gpus_per_node: 8\n")
    job = load_job(write(tmp_path, VALID + "cluster: hal\n"))
    assert job.spec.resources.partition == "gpu-new"
    assert job.spec.resources.gpus_per_node == 8
    assert job.spec.setup == []  # nothing inherited from the built-in


def test_bad_user_profile_names_its_own_file(tmp_path: Path, isolated: Path) -> None:
    profile = write_profile(isolated, "broken", "partiton: gpu\nmax_gpus_per_node: -1\n")
    error = spec_error(write(tmp_path, VALID + "cluster: broken\n"))
    assert error.source == str(profile)
    assert "did you mean 'partition'" in problem_at(error, "partiton").message
    assert problem_at(error, "partiton").line == 1
    assert problem_at(error, "max_gpus_per_node").line == 2


def test_invalid_yaml_in_a_user_profile_names_its_own_file(tmp_path: Path, isolated: Path) -> None:
    profile = write_profile(isolated, "broken", "partition: [gpu\n")
    error = spec_error(write(tmp_path, VALID + "cluster: broken\n"))
    assert error.source == str(profile)
    assert only_problem(error).message.startswith("invalid YAML")


# ---------------------------------------------------------------- cross-field checks


def test_gpus_above_what_the_profile_nodes_have(tmp_path: Path) -> None:
    problem = only_problem(spec_error(write(tmp_path, "name: a\ncluster: hal\nresources:\n  gpus_per_node: 8\n")))
    assert problem.key == "resources.gpus_per_node"
    assert problem.line == 4
    assert "'hal' nodes have 4" in problem.message
    assert "add nodes" in problem.message


def test_time_above_the_profile_limit(tmp_path: Path) -> None:
    problem = only_problem(spec_error(write(tmp_path, "name: a\ncluster: hal\nresources:\n  time: 2-00:00:00\n")))
    assert problem.key == "resources.time"
    assert "limit of 24:00:00" in problem.message


@pytest.mark.parametrize("output_dir", ["/data/imagenet", "/data/imagenet/runs", "/data/imagenet/../imagenet/r"])
def test_output_dir_inside_the_data_root_is_refused(tmp_path: Path, output_dir: str) -> None:
    path = write(tmp_path, f"name: a\noutput_dir: {output_dir}\ndata:\n  root: /data/imagenet\n")
    problem = only_problem(spec_error(path))
    assert problem.key == "output_dir"
    assert problem.line == 2
    assert "inside data.root" in problem.message


def test_output_dir_next_to_the_data_root_is_fine(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, "name: a\noutput_dir: /data/imagenet-runs\ndata:\n  root: /data/imagenet\n"))
    assert job.spec.output_dir == "/data/imagenet-runs"


def test_output_dir_inside_the_profile_data_root_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "name: a\ncluster: hal\noutput_dir: /home/shared/imagenet/raw/mine\n")
    assert only_problem(spec_error(path)).key == "output_dir"


@pytest.mark.parametrize(
    ("text", "key", "needle"),
    [
        ("trainer: {precision: fp16}", "trainer.precision", "use bf16"),
        ("trainer: {precision: O2}", "trainer.precision", "needs CUDA"),
        ("resources: {tasks_per_node: 2}\ntrainer: {strategy: single}", "trainer.strategy", "2 tasks"),
        ("resources: {nodes: 2}\ntrainer: {strategy: single}", "trainer.strategy", "'single' runs one process"),
        ("resources: {gpus_per_node: 2}\ntrainer: {strategy: hogwild}", "trainer.strategy", "gpus_per_node: 0"),
        ("resources: {nodes: 2}\ntrainer: {strategy: hogwild}", "trainer.strategy", "nodes: 1"),
        ("resources: {gpus_per_node: 4, tasks_per_node: 2}", "resources.tasks_per_node", "one task per GPU"),
        ("resources: {time: '00:01:00'}\nsignals: {signal_delay_s: 120}", "signals.signal_delay_s", "not shorter"),
        ("trainer: {strategy: hogwild, compile: true}", "trainer.compile", "compile: false"),
        ("resources: {gpus_per_node: 2}\ntrainer: {strategy: dp, compile: true}", "trainer.compile", "strategy dp"),
        ("resources: {gpus_per_node: 2}\ntrainer: {precision: O2, compile: true}", "trainer.compile", "Apex"),
        ("trainer: {strategy: ddp, dp_parallel_loss: true}", "trainer.dp_parallel_loss", "strategy: dp"),
    ],
)
def test_impossible_combinations(tmp_path: Path, text: str, key: str, needle: str) -> None:
    problem = problem_at(spec_error(write(tmp_path, VALID + text + "\n")), key)
    assert needle in problem.message
    assert problem.line is not None


@pytest.mark.parametrize(
    "text",
    [
        "trainer: {precision: bf16}",
        "resources: {gpus_per_node: 2}\ntrainer: {precision: fp16}",
        "resources: {gpus_per_node: 2}\ntrainer: {strategy: dp}",
        "resources: {nodes: 2, gpus_per_node: 2}\ntrainer: {strategy: dp}",  # tasks average gradients by hand
        "resources: {gpus_per_node: 2}\ntrainer: {strategy: dp, dp_parallel_loss: true}",
        "trainer: {strategy: hogwild, hogwild_processes: 4}",
        "trainer: {strategy: single}",
        "trainer: {strategy: single, compile: true, precision: bf16}",
        "resources: {gpus_per_node: 2}\ntrainer: {compile: true, precision: fp16}",
    ],
)
def test_possible_combinations(tmp_path: Path, text: str) -> None:
    load_job(write(tmp_path, VALID + text + "\n"))


def test_data_root_is_required_without_a_profile_default(tmp_path: Path) -> None:
    problem = only_problem(spec_error(write(tmp_path, "name: a\n")))
    assert problem.key == "data.root"
    assert "make-dataset" in problem.message


def test_entrypoint_jobs_need_no_dataset(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, "name: a\nentrypoint: mypkg.mod:main\nentrypoint_args: {n: 3}\n"))
    assert job.spec.entrypoint == "mypkg.mod:main"


def test_check_resolved_is_pure() -> None:
    spec = JobSpec.model_validate({"name": "a", "resources": {"gpus_per_node": 6}, "data": {"root": "/d"}})
    problems = check_resolved(spec, BUILTIN_PROFILES["hal"])
    assert [p.key for p in problems] == ["resources.gpus_per_node"]
    assert problems[0].line is None


# ---------------------------------------------------------------- sweeps


def test_sweep_expands_the_grid(tmp_path: Path) -> None:
    text = VALID + "sweep:\n  trainer.lr: [0.05, 0.1, 0.2]\n  trainer.label_smoothing: [0.0, 0.1]\n"
    job = load_job(write(tmp_path, text))
    assert job.is_sweep
    assert len(job.trials) == len(job.trial_params) == 6
    assert {(p["trainer.lr"], p["trainer.label_smoothing"]) for p in job.trial_params} == {
        (lr, ls) for lr in (0.05, 0.1, 0.2) for ls in (0.0, 0.1)
    }
    for trial, params in zip(job.trials, job.trial_params):
        assert trial.trainer.lr == params["trainer.lr"]
        assert trial.trainer.label_smoothing == params["trainer.label_smoothing"]
        assert not trial.sweep
        assert trial.data.root == "/datasets/imagenet"


def test_sweep_example_has_six_trials() -> None:
    job = load_job(REPO / "jobs" / "sweep_lr.yaml")
    assert len(job.trials) == 6
    assert all(t.resources.gpus_per_node == 4 for t in job.trials)  # the profile reaches every trial


def test_no_sweep_is_one_trial(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, VALID))
    assert not job.is_sweep
    assert job.trials == (job.spec,)
    assert job.trial_params == ({},)


@pytest.mark.parametrize(
    ("sweep", "key", "needle"),
    [
        ("trainer.lrx: [1, 2]", "sweep.trainer.lrx", "did you mean 'lr'"),
        ("trainer.lr: [0.1, -2]", "sweep.trainer.lr", "greater than 0"),
        ("trainer.lr.x: [1]", "sweep.trainer.lr", "valid number"),
        ("name.x: [1]", "sweep.name.x", "can be swept"),
        ("resources.nodes: [1, 2]", "sweep.resources.nodes", "resources go in study:"),
        ("trainer.lr: []", "sweep.trainer.lr", "at least one value"),
        ("trainer.lr: 0.1", "sweep.trainer.lr", "must be a list of values such as [0.1, 0.2], not 0.1"),
        ("trainer.lr: null", "sweep.trainer.lr", "not null"),
        ("trainer.lr: {a: 1}", "sweep.trainer.lr", "not {'a': 1}"),
    ],
)
def test_bad_sweeps(tmp_path: Path, sweep: str, key: str, needle: str) -> None:
    problem = problem_at(spec_error(write(tmp_path, VALID + "sweep:\n  " + sweep + "\n")), key)
    assert needle in problem.message
    assert problem.line is not None


def test_every_bad_sweep_key_is_reported_at_once(tmp_path: Path) -> None:
    text = VALID + "sweep:\n  trainer.lr: 0.1\n  resources.nodes: [1]\n  trainer.epochs: []\n"
    assert {p.key for p in spec_error(write(tmp_path, text)).problems} == {
        "sweep.trainer.lr",
        "sweep.resources.nodes",
        "sweep.trainer.epochs",
    }


def test_set_reaches_study_and_sweep_keys_which_are_dotted_themselves(tmp_path: Path) -> None:
    """--set study.resources.nodes=... used to build study: {resources: {nodes: ...}}."""
    path = write(tmp_path, VALID)
    job = load_job(path, ["study.resources.nodes=[1, 2]", "sweep.trainer.lr=[0.1, 0.2]"])
    assert [p.label for p in job.points] == ["nodes-1", "nodes-2"] and len(job.trials) == 2
    problem = only_problem(spec_error(path, ("study.resources.nodes=4",)))
    assert problem.key == "study.resources.nodes" and "set resources.nodes: 4 instead" in problem.message


def test_sweep_trials_get_the_cross_field_checks(tmp_path: Path) -> None:
    """A CPU sweep over precision used to validate and then fail on the nodes."""
    text = VALID + "cluster: local\nresources:\n  gpus_per_node: 0\nsweep:\n  trainer.precision: [fp32, fp16]\n"
    problem = only_problem(spec_error(write(tmp_path, text)))
    assert problem.key == "trainer.precision"
    assert "fp16 needs CUDA GPUs" in problem.message
    assert "sweep trial {'trainer.precision': 'fp16'}" in problem.message


def test_a_problem_of_the_base_spec_is_reported_once_for_a_sweep(tmp_path: Path) -> None:
    text = VALID + "resources:\n  gpus_per_node: 0\ntrainer:\n  precision: fp16\nsweep:\n  trainer.lr: [0.1, 0.2]\n"
    problem = only_problem(spec_error(write(tmp_path, text)))
    assert problem.key == "trainer.precision"


def test_val_resize_smaller_than_image_size_is_caught_on_the_login_node(tmp_path: Path) -> None:
    problem = only_problem(spec_error(write(tmp_path, VALID + "  image_size: 224\n  val_resize: 200\n")))
    assert problem.key == "data.val_resize"
    assert "at least 224" in problem.message
    assert problem.line == 5


def test_sweep_key_inside_a_scalar(tmp_path: Path) -> None:
    text = VALID + "trainer:\n  lr: 0.1\nsweep:\n  trainer.lr.x: [1, 2]\n"
    problem = only_problem(spec_error(write(tmp_path, text)))
    assert problem.key == "sweep.trainer.lr.x"
    assert "does not name a spec key" in problem.message
    assert problem.line == 7


@pytest.mark.parametrize("example", sorted(REPO.glob("jobs/*.yaml")), ids=lambda p: p.name)
def test_resolved_specs_load_back_unchanged(example: Path, tmp_path: Path) -> None:
    """``resume`` reads the resolved spec.yaml a submit wrote into the run directory."""
    for index, trial in enumerate(load_job(example).trials):
        written = tmp_path / f"trial-{index}.yaml"
        written.write_text(dump_yaml(trial.model_dump(mode="json")))
        assert load_job(written).spec == trial


# ---------------------------------------------------------------- relative paths


def test_relative_paths_are_resolved_against_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec_dir = tmp_path / "specs"
    spec_dir.mkdir()
    path = write(spec_dir, "name: a\noutput_dir: ./runs\ndata:\n  root: data/mini\ntrainer:\n  weights: w/init.pt\n")
    workdir = tmp_path / "work"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    spec = load_job(path).spec
    assert spec.output_dir == str(workdir.resolve() / "runs")
    assert spec.data.root == str(workdir.resolve() / "data" / "mini")
    assert spec.trainer.weights == str(workdir.resolve() / "w" / "init.pt")


def test_home_paths_are_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    spec = load_job(write(tmp_path, VALID + "output_dir: ~/runs\n")).spec
    assert spec.output_dir == str(tmp_path / "home" / "runs")


def test_sweep_trials_get_absolute_paths_too(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, "name: a\noutput_dir: runs\ndata: {root: d}\nsweep: {trainer.seed: [1, 2]}\n"))
    for trial in job.trials:
        assert Path(trial.output_dir).is_absolute()
        assert trial.data.root == str(tmp_path.resolve() / "d")


@pytest.mark.parametrize("decoder", ["gpu", "dali"])
def test_gpu_decoding_without_gpus_names_the_key_and_the_fix(tmp_path: Path, decoder: str) -> None:
    path = write(tmp_path, f"name: a\ndata:\n  root: /datasets/imagenet\n  decode: {decoder}\n")
    problem = only_problem(spec_error(path))
    assert problem.key == "data.decode" and problem.line == 4
    assert "gpus_per_node: 0" in problem.message and "'cpu' or 'auto'" in problem.message


@pytest.mark.parametrize("decoder", ["cpu", "auto", "gpu", "dali"])
def test_every_decoder_is_accepted_on_a_gpu_job(tmp_path: Path, decoder: str) -> None:
    text = f"name: a\nresources: {{gpus_per_node: 1}}\ndata:\n  root: /datasets/imagenet\n  decode: {decoder}\n"
    assert load_job(write(tmp_path, text)).spec.data.decode == decoder


# ---------------------------------------------------------------- hostile YAML (issue 12)


def _alias_bomb(depth: int = 9, width: int = 9) -> str:
    lines = ["name: bomb", "a0: &a0 [" + ", ".join(['"lol"'] * width) + "]"]
    for level in range(1, depth):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def test_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    import time

    start = time.process_time()  # CPU time: the machine's load is not the test's
    problem = only_problem(spec_error(write(tmp_path, _alias_bomb())))
    assert time.process_time() - start < 30  # CPU seconds, a hang guard: expanding the bomb would take hours
    assert "aliases" in problem.message and problem.line is not None


@pytest.mark.parametrize(
    ("value", "needle"),
    [("2026-13-45", "not a valid date (month must be in 1..12)"), ("1" * 5000, "not a valid whole number")],
    ids=["date", "digits"],
)
def test_a_scalar_python_cannot_build_is_a_spec_error_at_its_line(tmp_path: Path, value: str, needle: str) -> None:
    """Both were a ValueError traceback from PyYAML's constructors."""
    problem = only_problem(spec_error(write(tmp_path, VALID + f"entrypoint: a.b:c\nentrypoint_args: {{d: {value}}}\n")))
    assert needle in problem.message and "quote it" in problem.message and problem.line == 5
    assert len(problem.message) < 200  # the value is shortened, not echoed whole


def test_a_huge_value_is_quoted_short_in_every_message(tmp_path: Path) -> None:
    error = spec_error(write(tmp_path, VALID), (f"trainer.epochs={'1' * 5000}", f"name={'x' * 100_000}"))
    assert {p.key for p in error.problems} == {"trainer.epochs", "name"}
    assert all(len(p.message) < 300 for p in error.problems), error.message[:500]


def test_complex_key_is_a_spec_error(tmp_path: Path) -> None:
    problem = only_problem(spec_error(write(tmp_path, "name: x\n? [a, b]\n: 1\n")))
    assert "key must be a plain word" in problem.message and problem.line == 2


def test_absurd_nesting_is_refused_without_recursion(tmp_path: Path) -> None:
    problem = only_problem(spec_error(write(tmp_path, "name: x\nk: " + "[" * 50_000 + "\n")))
    assert "nested more than" in problem.message and problem.line == 2


@pytest.mark.parametrize("make", ["fifo", "device"])
def test_non_regular_files_are_refused_without_reading(tmp_path: Path, make: str) -> None:
    import os

    if make == "fifo":
        path = tmp_path / "pipe.yaml"
        os.mkfifo(path)
    else:
        path = Path("/dev/zero")
    assert "not a regular file" in only_problem(spec_error(path)).message


def test_merge_keys_and_x_anchor_holders(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        name: merged
        x-big: &big {nodes: 2, time: "02:00:00"}
        data: {root: /datasets/imagenet}
        resources:
          <<: *big
          time: "03:00:00"
        """,
    )
    spec = load_job(path).spec
    assert (spec.resources.nodes, spec.resources.time) == (2, "03:00:00")


def test_sweep_above_max_array_size_is_refused_before_expanding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from tests.fake_slurm import FakeSlurm

    FakeSlurm(answers={"scontrol show config": (0, "MaxArraySize = 500\n")}).install(monkeypatch)
    values = {"lr": [0.001 * (i + 1) for i in range(400)], "seed": list(range(300))}
    text = f"name: big\ncluster: slurm\ndata: {{root: /d}}\nsweep:\n  trainer.lr: {values['lr']}\n"
    text += f"  trainer.seed: {values['seed']}\n"
    start = time.process_time()  # CPU time: the machine's load is not the test's
    problem = problem_at(spec_error(write(tmp_path, text)), "sweep")
    assert time.process_time() - start < 2
    assert "400 x 300 = 120,000" in problem.message and "500" in problem.message
    # Without Slurm (the local profile) the limit is Slurm's default, 1001.
    local = write(tmp_path, text.replace("cluster: slurm", "cluster: local"), "local.yaml")
    assert "1,001" in problem_at(spec_error(local), "sweep").message


@pytest.mark.parametrize(
    ("override", "key", "needle"),
    [
        ("trainer.arch=resnet5000", "trainer.arch", "did you mean resnet50"),
        ("trainer.arch=transformer_xl", "trainer.arch", "families: alexnet"),
        ("resources.mem_gb=0.0001", "resources.mem_gb", "--mem=0MB"),
        ("resources.mem_gb=.inf", "resources.mem_gb", "finite number"),
        ("trainer.lr=.inf", "trainer.lr", "finite number"),
        ("trainer.batch_size=1000000000000000000000000000000", "trainer.batch_size", "less than or equal"),
        ("trainer.desired_acc=0.75", "trainer.desired_acc", "write desired_acc: 75"),
    ],
)
def test_specs_that_would_fail_after_the_queue(tmp_path: Path, override: str, key: str, needle: str) -> None:
    problem = problem_at(spec_error(write(tmp_path, VALID), (override,)), key)
    assert needle in problem.message


def test_dp_runs_one_task_per_node(tmp_path: Path) -> None:
    overrides = ("trainer.strategy=dp", "resources.gpus_per_node=4", "resources.tasks_per_node=4")
    assert (
        "one task per node"
        in problem_at(spec_error(write(tmp_path, VALID), overrides), "resources.tasks_per_node").message
    )
    spec = load_job(write(tmp_path, VALID), overrides[:2]).spec
    assert spec.tasks_per_node == 1


def test_arch_table_matches_torchvision() -> None:
    torchvision = pytest.importorskip("torchvision")
    from hpctrain.jobspec.archs import ARCH_PARAMS_M

    assert sorted(ARCH_PARAMS_M) == sorted(torchvision.models.list_models(module=torchvision.models))


def test_cluster_profiles_pass_the_same_checks_as_specs(tmp_path: Path, isolated: Path) -> None:
    (isolated / "clusters").mkdir(parents=True)
    (isolated / "clusters" / "site.yaml").write_text(
        textwrap.dedent(
            """\
            partition: "gpu; rm -rf ~"
            max_time: forever
            gpu_gres: "gpu:{count}"
            mem_gb: .inf
            setup: ["module load x; curl evil | sh"]
            env: {"A B": "x"}
            slurm_extra: {"x y": "1"}
            """
        )
    )
    error = spec_error(write(tmp_path, VALID + "cluster: site\n"))
    assert error.source.endswith("site.yaml")
    keys = {p.key for p in error.problems}
    assert keys == {"partition", "max_time", "gpu_gres", "mem_gb", "setup.0", "env.A B", "slurm_extra.x y"}
    assert all(p.line is not None for p in error.problems)
    assert "cluster: site" in (error.hint or "")


def test_a_good_gres_template_is_accepted(tmp_path: Path, isolated: Path) -> None:
    (isolated / "clusters").mkdir(parents=True)
    (isolated / "clusters" / "site.yaml").write_text('gpu_gres: "gpu:a100_3g.20gb:{gpus}"\nmax_time: 2-00:00:00\n')
    assert load_job(write(tmp_path, VALID + "cluster: site\n")).profile.gpu_gres == "gpu:a100_3g.20gb:{gpus}"


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ("runtime: apptainer, image: a.sif, options: [--bind=/x]", "--bind is set by hpctrain from container.mounts"),
        ("runtime: apptainer, image: a.sif, options: [--pwd=/x]", "--pwd is set by hpctrain"),
        ("runtime: pyxis, image: a.sqsh, options: [--container-image=x]", "set by hpctrain from container.image"),
        ("runtime: pyxis, image: a.sqsh, options: [--nodes=9]", "--nodes is not a pyxis flag"),
    ],
)
def test_container_options_that_clash_with_the_runtime_name_the_fix(tmp_path: Path, options: str, needle: str) -> None:
    problem = only_problem(spec_error(write(tmp_path, VALID + f"container: {{{options}}}\n")))
    assert problem.key.startswith("container") and needle in problem.message, problem.message


def test_container_options_that_fit_are_kept_in_order(tmp_path: Path) -> None:
    text = VALID + "container: {runtime: apptainer, image: a.sif, options: [--no-privs, --writable-tmpfs, -e]}\n"
    assert load_job(write(tmp_path, text)).spec.container.options == ["--no-privs", "--writable-tmpfs", "-e"]
