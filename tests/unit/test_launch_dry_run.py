"""What ``submit --dry-run`` says about a script job's burn-in (launch/dry_run.py's ``burn_in_note``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import in_process

from hpctrain.jobspec.models import JobSpec
from hpctrain.launch.dry_run import burn_in_note, shell_words


def spec(nodes: int = 3, **sections: Any) -> JobSpec:
    data = {"name": "s", "resources": {"nodes": nodes}, "script": {"path": "t.py"}}
    return JobSpec.model_validate({**data, **sections})


def test_a_multi_node_script_job_says_every_start_probes_its_nodes() -> None:
    assert burn_in_note(spec(), local=False) == (
        "\n# burn-in: every start probes its 3 nodes before the script starts (up to 20 s; a sick node is taken "
        "out while its partition can spare it; health.burn_in.enabled: false turns it off; docs/node-health.md)\n"
    )


def test_torchrun_says_its_node_tasks_probe_and_off_local_or_one_node_say_nothing() -> None:
    assert "probes its 3 nodes before torchrun starts" in burn_in_note(spec(launcher="torchrun"), local=False)
    assert burn_in_note(spec(health={"burn_in": {"enabled": False}}), local=False) == ""
    assert burn_in_note(spec(), local=True) == ""
    assert burn_in_note(spec(nodes=1), local=False) == ""


# -- what --dry-run prints quotes user text: nothing reaches the terminal raw ---------------------------------------
HIDDEN = ["\u202e", "\u2028", "\u2066", "\u200b", "\ufeff"]  # C0/C1 controls are refused in arguments


@pytest.mark.parametrize("char", HIDDEN, ids=[f"U+{ord(c):04X}" for c in HIDDEN])
def test_dry_run_escapes_arguments_and_folder_names(
    char: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / f"proj{char}x"
    folder.mkdir()
    (folder / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HPCTRAIN_CONFIG_DIR", str(tmp_path / "config"))
    script = {"path": f"proj{char}x/train.py", "args": [f"a{char}b", "{sweep.v}"]}
    data = {"name": "s", "cluster": "local", "resources": {"gpus_per_node": 0}, "script": script}
    data["sweep"] = {"v": [f"c{char}d"]}
    (tmp_path / "job.yaml").write_text(json.dumps(data))
    done = in_process(capsys, "submit", "job.yaml", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert char not in done.stdout + done.stderr
    code = f"\\u{ord(char):04x}"
    assert f"$'a{code}b' $'c{code}d'" in done.stdout  # exact and pasteable: bash's $'...' form
    assert f"proj\\x{ord(char):02x}x" in done.stdout  # the folder, escaped as every message escapes


def test_shell_words_is_what_bash_reads() -> None:
    import subprocess

    words = ["plain", "it's", "a\u202eb", "c\u2028d", "e\\f'g\x85", "sp ace", "caf\u00e9"]
    echoed = subprocess.run(
        ["bash", "-c", f"printf '%s\\0' {shell_words(words)}"], capture_output=True, check=True, env={"LANG": "C.UTF-8"}
    ).stdout
    assert echoed.decode().split("\0")[:-1] == words
