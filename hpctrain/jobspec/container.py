"""``container:``: run every task inside a container image (pyxis/enroot or Apptainer; docs/containers.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from hpctrain.jobspec.fields import (
    CONTAINER_IMAGE_PATTERN,
    CONTAINER_MOUNT_PATTERN,
    CONTAINER_OPTION_PATTERN,
    CONTAINER_PYTHON_PATTERN,
)
from hpctrain.jobspec.section import Section

# Flags hpctrain writes itself, per runtime -> the spec key that sets them.
OWNED_CONTAINER_FLAGS: dict[str, dict[str, str]] = {
    "apptainer": {"--bind": "container.mounts", "-B": "container.mounts", "--pwd": "the submit directory"},
    "pyxis": {
        "--container-image": "container.image",
        "--container-mounts": "container.mounts",
        "--container-workdir": "the submit directory",
    },
}


class Container(Section):
    """Run every task inside a container image; requeue decisions stay outside it."""

    runtime: Annotated[
        Literal["pyxis", "apptainer"],
        Field(description="pyxis/enroot ('srun --container-image') or Apptainer/Singularity ('apptainer exec')."),
    ]
    image: Annotated[
        str,
        Field(
            pattern=CONTAINER_IMAGE_PATTERN,
            description="pyxis: an image reference (nvcr.io#nvidia/pytorch:24.05-py3) or a .sqsh file; "
            "apptainer: a .sif file or a docker:// reference.",
        ),
    ]
    mounts: Annotated[
        list[Annotated[str, Field(pattern=CONTAINER_MOUNT_PATTERN)]],
        Field(
            description="Extra bind mounts SRC[:DST[:ro]]; output_dir, data.root and the submit directory "
            "are mounted at their own paths always."
        ),
    ] = []
    python: Annotated[
        str,
        Field(
            pattern=CONTAINER_PYTHON_PATTERN,
            description="The interpreter inside the image (hpctrain and torch must be installed there).",
        ),
    ] = "python3"
    options: Annotated[
        list[Annotated[str, Field(pattern=CONTAINER_OPTION_PATTERN)]],
        Field(
            description="Extra runtime flags, one per entry, a value joined with '=': apptainer exec's "
            "(--nv, --no-privs, --writable-tmpfs, --drop-caps=CAP_SYS_RESOURCE) or pyxis's srun "
            "--container-* flags (--container-remap-root, --no-container-mount-home)."
        ),
    ] = []

    @model_validator(mode="after")
    def _options_fit_the_runtime(self) -> Container:
        problems = []
        for flag in (option.split("=", 1)[0] for option in self.options):
            owner = OWNED_CONTAINER_FLAGS[self.runtime].get(flag)
            if owner:
                problems.append(f"{flag} is set by hpctrain from {owner}; set that instead")
            elif self.runtime == "pyxis" and not flag.startswith(("--container-", "--no-container-")):
                problems.append(f"{flag} is not a pyxis flag: pyxis options are srun's --container-* flags")
        if problems:
            raise ValueError("container.options: " + "; ".join(problems))
        return self
