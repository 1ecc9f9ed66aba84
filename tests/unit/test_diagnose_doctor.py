"""``hpctrain doctor``: each check over recorded Slurm answers and real folders; the mount table; the probe's report."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from hpctrain.contract.slurm import Slurm
from hpctrain.diagnose import cluster_checks, doctor, filesystems, path_checks, preflight
from hpctrain.diagnose.probe import probe_command, probe_findings, report, sbatch_args
from hpctrain.jobspec.load import load_job
from tests.fake_slurm import FakeSlurm, nowhere, on_path

PARTITIONS = """\
PartitionName=debug Default=YES MaxTime=UNLIMITED State=UP PreemptMode=REQUEUE GraceTime=60
PartitionName=short Default=NO MaxTime=00:02:00 State=UP PreemptMode=CANCEL GraceTime=0
"""
NODES = """\
NodeName=n0 CPUTot=4 RealMemory=4000 Gres=(null) Partitions=debug,short State=IDLE
NodeName=n1 CPUTot=4 RealMemory=4000 Gres=(null) Partitions=debug,short State=IDLE
NodeName=g0 CPUTot=40 RealMemory=256000 Gres=gpu:v100:4(S:0-1) Partitions=gpu State=IDLE
"""
CONFIG = "PreemptType              = preempt/partition_prio\nPreemptMode              = REQUEUE\n"
MOUNTS = """\
overlay / overlay rw 0 0
tmpfs /dev/shm tmpfs rw 0 0
server:/home /home nfs4 rw 0 0
/dev/sda1 /scratch\\040space ext4 rw 0 0
lustre@tcp:/fs /lustre lustre rw 0 0
"""


def fake_slurm(**overrides: tuple[int, str]):  # type: ignore[no-untyped-def]
    answers = {
        "sbatch --version": (0, "slurm-wlm 22.05.8\n"),
        "scontrol ping": (0, "Slurmctld(primary) at ctl is UP\n"),
        "sacct": (0, ""),
        "scontrol show config": (0, CONFIG),
        "scontrol --oneliner show partition": (0, PARTITIONS),
        "scontrol --oneliner show node": (0, NODES),
        "sacctmgr": (0, "research||normal\nteach|debug|normal,long\n"),
        **overrides,
    }

    def runner(command: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        text = " ".join(command)
        for prefix in sorted(answers, key=len, reverse=True):
            if text.startswith(prefix):
                code, out = answers[prefix]
                return subprocess.CompletedProcess(command, code, out if code == 0 else "", "" if code == 0 else out)
        raise AssertionError(f"unexpected command {text}")

    return cluster_checks.ClusterView(Slurm(runner, which=on_path))


pytestmark = pytest.mark.usefixtures("isolated")


def job(tmp_path: Path, *sets: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "job.yaml"
    path.write_text(f"name: j\ncluster: slurm\noutput_dir: {tmp_path / 'runs'}\ndata: {{root: {tmp_path / 'data'}}}\n")
    return load_job(path, ["resources.partition=debug", "resources.gpus_per_node=0", *sets])


def by_name(checks: list[doctor.Check]) -> dict[str, doctor.Check]:
    return {check.name: check for check in checks}


def test_a_healthy_cluster_passes_every_slurm_check() -> None:
    checks = by_name(cluster_checks.check_slurm(fake_slurm()))
    assert [c.level for c in checks.values()] == ["ok", "ok", "ok"]
    assert "22.05.8" in checks["slurm clients"].detail


def test_no_slurm_and_a_stopped_controller_are_errors_with_the_fix() -> None:
    missing = cluster_checks.ClusterView(Slurm(FakeSlurm(), which=nowhere))
    (only,) = cluster_checks.check_slurm(missing)
    assert only.level == "error" and "--local" in only.fix
    down = fake_slurm(**{"scontrol ping": (1, "Unable to contact slurm controller (connect failure)")})
    checks = by_name(cluster_checks.check_slurm(down))
    assert checks["controller"].level == "error" and "admins" in checks["controller"].fix
    assert "accounting" not in checks  # nothing else can be asked


def test_accounting_off_is_a_warning() -> None:
    view = fake_slurm(sacct=(1, "Slurm accounting storage is disabled"))
    assert by_name(cluster_checks.check_slurm(view))["accounting"].level == "warning"


def test_time_above_the_partitions_max_time_is_an_error(tmp_path: Path) -> None:
    checks = cluster_checks.check_spec_on_cluster(
        job(tmp_path, "resources.partition=short", "resources.time=00:30:00"), fake_slurm()
    )
    assert any(c.name == "resources.time" and c.level == "error" and "00:02:00" in c.detail for c in checks)


def test_gpus_no_node_of_the_partition_has_are_an_error(tmp_path: Path) -> None:
    checks = by_name(cluster_checks.check_spec_on_cluster(job(tmp_path, "resources.gpus_per_node=4"), fake_slurm()))
    assert checks["resources"].level == "error"
    assert "4 GPUs per node (its nodes have at most 0)" in checks["resources"].detail


def test_too_many_cpus_and_nodes(tmp_path: Path) -> None:
    cpus = by_name(cluster_checks.check_spec_on_cluster(job(tmp_path, "resources.cpus_per_task=8"), fake_slurm()))
    assert cpus["resources"].level == "error" and "8 CPUs per node" in cpus["resources"].detail
    nodes = by_name(cluster_checks.check_spec_on_cluster(job(tmp_path, "resources.nodes=3"), fake_slurm()))
    assert nodes["resources"].level == "error" and "3 nodes" in nodes["resources"].detail


def test_gpu_count_is_read_from_gres() -> None:
    assert cluster_checks._gpus_of({"Gres": "gpu:v100:4(S:0-1)"}) == 4
    assert cluster_checks._gpus_of({"Gres": "gpu:a100:2,gpu:v100:2,mps:100"}) == 4
    assert cluster_checks._gpus_of({"Gres": "(null)"}) == 0 == cluster_checks._gpus_of({})


def test_account_and_qos_must_be_yours(tmp_path: Path) -> None:
    bad = by_name(cluster_checks.check_spec_on_cluster(job(tmp_path, "resources.account=nope"), fake_slurm()))
    assert bad["account/qos"].level == "error" and "research" in bad["account/qos"].fix
    qos = by_name(cluster_checks.check_spec_on_cluster(job(tmp_path, "resources.qos=long"), fake_slurm()))
    assert qos["account/qos"].level == "ok"  # teach may use long on debug
    wrong = by_name(cluster_checks.check_spec_on_cluster(job(tmp_path, "resources.qos=gold"), fake_slurm()))
    assert wrong["account/qos"].level == "error"


def test_preemption_is_explained(tmp_path: Path) -> None:
    ok = by_name(cluster_checks.check_spec_on_cluster(job(tmp_path, "trainer.arch=resnet18"), fake_slurm()))
    assert ok["preemption"].level == "ok" and "requeued" in ok["preemption"].detail
    short = by_name(cluster_checks.check_spec_on_cluster(job(tmp_path, "resources.partition=short"), fake_slurm()))
    assert short["preemption"].level == "warning" and "GraceTime 0 s" in short["preemption"].detail
    assert "every_steps" in short["preemption"].fix
    off = fake_slurm(**{"scontrol show config": (0, "PreemptType = preempt/none\n")})
    assert "not preempted" in by_name(cluster_checks.check_spec_on_cluster(job(tmp_path), off))["preemption"].detail


def test_mount_table_decides_sharing() -> None:
    mounts = filesystems.parse_mounts(MOUNTS)
    assert filesystems.mount_for("/home/me/runs", mounts).sharing == "shared"
    assert filesystems.mount_for("/dev/shm/runs", mounts).sharing == "memory"
    assert filesystems.mount_for("/scratch space/x", mounts).fstype == "ext4"
    assert filesystems.mount_for("/lustre/project", mounts).fstype == "lustre"
    assert filesystems.mount_for("/homework", mounts).fstype == "overlay"  # not under /home


def test_output_dir_on_tmpfs_is_an_error_for_slurm_and_fine_locally(tmp_path: Path) -> None:
    assert path_checks.check_output_dir("/dev/shm/runs", True, MOUNTS).level == "error"
    assert path_checks.check_output_dir("/dev/shm/runs", False, MOUNTS).level == "ok"
    assert path_checks.check_output_dir(str(tmp_path), True, f"server:/x {tmp_path.anchor} nfs rw 0 0\n").level == "ok"


def test_submit_refuses_an_output_dir_on_tmpfs(tmp_path: Path) -> None:
    spec = job(tmp_path, "output_dir=/dev/shm/hpctrain-runs").spec
    (finding,) = preflight.check_output_dir(spec, MOUNTS)
    assert finding.level == "error" and finding.key == "output_dir" and "shared file system" in finding.message
    assert preflight.check_output_dir(job(tmp_path, "output_dir=/home/me").spec, MOUNTS) == []


def test_image_folder_sample(tmp_path: Path) -> None:
    root = tmp_path / "data"
    for split, classes in (("train", "abc"), ("val", "abc")):
        for name in classes:
            (root / split / name).mkdir(parents=True)
            (root / split / name / "x.JPEG").write_bytes(b"\xff\xd8")
    assert path_checks.check_image_folder(root, "train", "val").level == "ok"
    (root / "val" / "d").mkdir()
    (root / "train" / "a" / "x.JPEG").unlink()
    (root / "train" / "a" / "notes.txt").write_text("")
    check = path_checks.check_image_folder(root, "train", "val")
    assert (
        check.name == "dataset"
        and check.level == "error"
        and "train/a/ has no image" in check.detail
        and "4" in check.detail
    )


def test_paths_for_a_missing_dataset(tmp_path: Path) -> None:
    checks = by_name(path_checks.check_paths(job(tmp_path), slurm_backend=True, mounts_text=MOUNTS))
    assert checks["data.root"].level == "error" and "does not exist" in checks["data.root"].detail


def test_probe_command_is_quoted_and_sbatch_gets_the_spec_resources(tmp_path: Path) -> None:
    line = probe_command("/venv/bin/python", "/data/it's here", "/runs; rm -rf ~")
    assert "'/runs; rm -rf ~'" in line and "'/data/it'\"'\"'s here'" in line
    args = sbatch_args(partition="gpu", gres="gpu:4", account=None, qos="q", output=tmp_path / "o", wrap=line)
    assert "--partition=gpu" in args and "--gres=gpu:4" in args and "--qos=q" in args and args[-2:] == ["--wrap", line]


def test_probe_report_from_this_machine(tmp_path: Path) -> None:
    found = report(str(tmp_path), str(tmp_path))
    assert found["data_root_readable"] and found["output_dir_writable"] and found["torch"]
    assert probe_findings(found, wants_gpus=0) == []
    assert [p.key for p in probe_findings(found, wants_gpus=4)] == ["resources.gpus_per_node"]
    blind = {**found, "data_root_readable": False, "data_root_error": "No such file or directory"}
    assert [p.key for p in probe_findings(blind, wants_gpus=0)] == ["data.root"]


def test_cli_exit_code_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from hpctrain.cli.main import main

    spec = tmp_path / "local.yaml"
    spec.write_text(
        f"name: j\ncluster: local\noutput_dir: {tmp_path / 'runs'}\ndata: {{root: {tmp_path / 'nodata'}}}\n"
    )
    assert main(["doctor", str(spec), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["errors"] == 1
    assert {c["name"] for c in report["checks"] if c["level"] == "error"} == {"data.root"}
    for split in ("train", "val"):
        (tmp_path / "nodata" / split / "a").mkdir(parents=True)
        (tmp_path / "nodata" / split / "a" / "x.jpg").write_bytes(b"")
    assert main(["doctor", str(spec)]) == 0
    assert "nothing stops this job" in capsys.readouterr().out


EXPEDITE_ON = "SLURM_VERSION = 26.05.5\nSlurmctldParameters = enable_expedited_requeue\n"


def test_expedited_requeue_is_reported_with_whether_the_job_uses_it(tmp_path: Path) -> None:
    on = fake_slurm(**{"scontrol show config": (0, CONFIG + EXPEDITE_ON)})
    old = fake_slurm(**{"scontrol show config": (0, CONFIG + "SLURM_VERSION = 24.11.5\n")})
    [cluster] = cluster_checks.check_expedited_requeue(None, on.config)
    assert cluster.level == "ok" and cluster.detail.startswith("available (Slurm 26.05 with")
    [unused] = cluster_checks.check_expedited_requeue(job(tmp_path), on.config)
    assert "not used: resources.expedited_requeue is false" in unused.detail and "auto" in unused.fix
    [used] = cluster_checks.check_expedited_requeue(job(tmp_path, "resources.expedited_requeue=auto"), on.config)
    assert used.detail.endswith("this job is submitted with --requeue=expedite")
    [plain] = cluster_checks.check_expedited_requeue(job(tmp_path, "resources.expedited_requeue=auto"), old.config)
    assert (
        plain.level == "ok"
        and "not available (Slurm 24.11 has none" in plain.detail
        and "plain --requeue" in plain.detail
    )
    [refused] = cluster_checks.check_expedited_requeue(job(tmp_path, "resources.expedited_requeue=true"), old.config)
    assert (refused.level, refused.name) == ("error", "resources.expedited_requeue") and "auto" in refused.fix
    [unknown] = cluster_checks.check_expedited_requeue(None, {})
    assert unknown.level == "warning"


def test_doctor_lists_expedited_requeue_among_its_checks(tmp_path: Path) -> None:
    view = fake_slurm(**{"scontrol show config": (0, CONFIG + EXPEDITE_ON)})
    checks = by_name(doctor.run_checks(job(tmp_path), slurm_backend=True, view=view))
    assert checks["expedited requeue"].detail.startswith("available")


def test_a_job_that_needs_every_usable_node_is_told_a_sick_one_cannot_be_left_out(tmp_path: Path) -> None:
    """healing/decide.py keeps a flagged node rather than requeue into a job the partition cannot run:
    doctor says so before the job is submitted, counting only nodes that can run a job."""
    full = by_name(cluster_checks.check_spec_on_cluster(job(tmp_path, "resources.nodes=2"), fake_slurm()))
    assert full["node health"].level == "warning" and "all 2 usable nodes of debug" in full["node health"].detail
    one = by_name(cluster_checks.check_spec_on_cluster(job(tmp_path, "resources.nodes=1"), fake_slurm()))
    assert "node health" not in one  # a single node has no burn-in and nothing to leave out
    three = NODES + "NodeName=n2 CPUTot=4 RealMemory=4000 Gres=(null) Partitions=debug State=IDLE\n"
    room = fake_slurm(**{"scontrol --oneliner show node": (0, three)})
    spare = by_name(cluster_checks.check_spec_on_cluster(job(tmp_path, "resources.nodes=2"), room))
    assert spare["node health"].level == "ok" and "up to 1 sick or lost node of debug" in spare["node health"].detail
    drained = fake_slurm(
        **{"scontrol --oneliner show node": (0, three.replace("debug State=IDLE", "debug State=IDLE+DRAIN"))}
    )
    gone = by_name(cluster_checks.check_spec_on_cluster(job(tmp_path, "resources.nodes=2"), drained))
    assert gone["node health"].level == "warning"
    off = by_name(
        cluster_checks.check_spec_on_cluster(
            job(tmp_path, "resources.nodes=2", "health.burn_in.enabled=false"), fake_slurm()
        )
    )
    assert "node health" not in off  # no burn-in and no healing: nothing is ever left out


def test_doctor_counts_the_nodes_that_fit_as_a_requeue_does(tmp_path: Path) -> None:
    """One count (slurm_answers.NodeNeeds): the features of a plain --constraint too, as sinfo's room does;
    n2 lacks 'ib', so the 2-node job with constraint ib has no node to spare."""
    three = (
        "NodeName=n0 CPUTot=4 RealMemory=4000 Gres=(null) AvailableFeatures=ib,v100 Partitions=debug State=IDLE\n"
        "NodeName=n1 CPUTot=4 RealMemory=4000 Gres=(null) AvailableFeatures=ib Partitions=debug State=IDLE\n"
        "NodeName=n2 CPUTot=4 RealMemory=4000 Gres=(null) AvailableFeatures=(null) Partitions=debug State=IDLE\n"
    )
    view = fake_slurm(**{"scontrol --oneliner show node": (0, three)})
    plain = by_name(cluster_checks.check_spec_on_cluster(job(tmp_path, "resources.nodes=2"), view))
    assert "up to 1 sick or lost node" in plain["node health"].detail
    ib = by_name(
        cluster_checks.check_spec_on_cluster(job(tmp_path, "resources.nodes=2", "resources.constraint=ib"), view)
    )
    assert ib["resources"].level == "ok" and "2 of 3 nodes in debug fit" in ib["resources"].detail
    assert ib["node health"].level == "warning" and "all 2 usable nodes of debug" in ib["node health"].detail
    both = cluster_checks.check_spec_on_cluster(
        job(tmp_path, "resources.nodes=2", "resources.constraint=ib&v100"), view
    )
    assert by_name(both)["resources"].level == "error"
