"""jobspec/login.py: a cluster profile's login: section (issue 39)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from hpctrain.errors import SpecError
from hpctrain.jobspec.login import LoginHost
from hpctrain.jobspec.profiles import load_profile


def test_hals_login_reads_with_defaults_left_to_ssh() -> None:
    login = LoginHost(host="hal.ncsa.illinois.edu", user="alice", jump="bastion.example.org:2222")
    assert (login.port, login.ssh_config, login.persist, login.command_words()) == (None, None, "8h", ["hpctrain"])


@pytest.mark.parametrize(
    "field",
    [
        {"host": "-oProxyCommand=touch /tmp/x"},
        {"host": "hal", "user": "-lroot"},
        {"host": "hal", "jump": "-Jevil"},
        {"host": "hal", "port": 0},
        {"host": "hal", "persist": "forever"},
        {"host": "hal", "hpctrain": "'unbalanced"},
        {"host": "hal", "hpctrain": ""},
        {"host": "hal", "ssh_config": "a\nb"},
        {"host": "hal", "password": "no"},
    ],
)
def test_what_could_become_an_ssh_option_or_is_unknown_is_refused(field: dict) -> None:
    with pytest.raises(ValidationError):
        LoginHost.model_validate(field)


def test_a_bad_login_in_a_user_profile_names_the_file_and_key(isolated: Path) -> None:
    (isolated / "clusters").mkdir(parents=True)
    (isolated / "clusters" / "hal.yaml").write_text("login:\n  host: hal.ncsa.illinois.edu\n  prot: 22\n")
    with pytest.raises(SpecError) as caught:
        load_profile("hal")
    assert "hal.yaml" in caught.value.message and "login.prot" in caught.value.message


def test_a_profile_with_login_keeps_the_rest_of_the_builtin_fields(isolated: Path) -> None:
    (isolated / "clusters").mkdir(parents=True)
    (isolated / "clusters" / "hal.yaml").write_text(
        "partition: gpu\ngpus_per_node: 4\nlogin: {host: hal.ncsa.illinois.edu, user: alice}\n"
    )
    profile = load_profile("hal")
    assert profile.login is not None and profile.login.user == "alice" and profile.gpus_per_node == 4
    assert load_profile("slurm").login is None
