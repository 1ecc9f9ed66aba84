"""The checked value types of the job spec: patterns, what each allows in words, and
checks that run per entry of a mapping or list, so every bad entry is reported at once.

``models.py`` builds the sections from these; ``problems.py`` looks a pattern's rule up
in PATTERN_RULES when a value does not match. Values that become words of an sbatch,
srun or apptainer command line never start with '-'. Pure and torch-free.
"""

from __future__ import annotations

import re
import reprlib
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
SLURM_OPTION_PATTERN = r"^[a-z][a-z0-9-]*$"
BLOCK_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$"  # a module path such as layer3 or features.7
SLURM_VALUE_PATTERN = r"^[A-Za-z0-9_.,:=/@%+\-\[\]]*$"
# Partition/account/qos/constraint words; constraints may also use & | ! ( ). Never a leading '-'.
SLURM_WORD_PATTERN = r"^[A-Za-z0-9_.,:=/@%+\[\]&|!()*][A-Za-z0-9_.,:=/@%+\-\[\]&|!()*]*$"
NCCL_NAME_PATTERN = r"^(NCCL|TORCH_NCCL)_[A-Z0-9_]+$"
MODULE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
ENTRYPOINT_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
# A profile's login: (jobspec/login.py): never a leading '-' (an ssh option smuggled in as a name).
LOGIN_HOST_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.:-]*$"
LOGIN_USER_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"
_HOP = r"([A-Za-z0-9_][A-Za-z0-9_.-]*@)?[A-Za-z0-9_][A-Za-z0-9_.-]*(:[0-9]+)?"
LOGIN_JUMP_PATTERN = rf"^{_HOP}(,{_HOP})*$"
SSH_TIME_PATTERN = r"^([0-9]+[smhdw]?)+$"
# Characters that would let a setup line run more than the one command it names.
_SETUP_FORBIDDEN = re.compile(r"[;&|<>`\n\r\x00]|\$\(")
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
_REPR = reprlib.Repr()
_REPR.maxlist = _REPR.maxdict = 4
_REPR.maxstring = _REPR.maxother = 40

# Image and interpreter become words of 'apptainer exec' / 'srun' command lines: never a leading '-'.
CONTAINER_IMAGE_PATTERN = r"^[A-Za-z0-9_.:/#@+][A-Za-z0-9_.:/#@+\-]*$"
_MOUNT_PATH = r"/[A-Za-z0-9_.+@%=/\-]*"
CONTAINER_MOUNT_PATTERN = rf"^{_MOUNT_PATH}(:{_MOUNT_PATH}(:(ro|rw))?)?$"
CONTAINER_PYTHON_PATTERN = r"^[A-Za-z0-9_./+][A-Za-z0-9_./+\-]*$"
# One runtime flag, its value joined with '=' (a separate value word would read as the image).
CONTAINER_OPTION_PATTERN = r"^--?[A-Za-z][A-Za-z0-9\-]*(=[A-Za-z0-9_.,:=/@%+\-]+)?$"


def scalars_to_str(value: object) -> object:
    """``env: {OMP_NUM_THREADS: 4}`` means the string "4": environment values,
    NCCL variables and sbatch options are strings, however YAML typed them."""
    if isinstance(value, dict):
        return {
            key: ("true" if item is True else "false" if item is False else str(item))
            if isinstance(item, (int, float, bool))
            else item
            for key, item in value.items()
        }
    return value


def check_mem_gb(value: float | None) -> float | None:
    """sbatch gets ``--mem`` in whole MiB, and ``--mem=0`` means all of the node's memory."""
    if value is not None and value * 1024 < 1:
        raise ValueError(
            f"{value} GiB rounds to --mem=0MB, which Slurm reads as the whole node's memory; "
            "ask for at least 0.001 (1 MiB), or remove mem_gb"
        )
    return value


def check_slurm_word(value: str | None) -> str | None:
    if value is not None and not re.match(SLURM_WORD_PATTERN, value):
        raise ValueError(f"{shown_value(value)} {PATTERN_RULES[SLURM_WORD_PATTERN]}")
    return value


def check_setup_line(line: str) -> str:
    """Setup lines go into the sbatch script as they are: each must be one command."""
    if _SETUP_FORBIDDEN.search(line):
        raise ValueError(
            f"setup line {shown_value(line)} contains ; & | < > ` or $( ; each line must be one command "
            "(put anything more complex in a script and 'source' it)"
        )
    return line


def check_no_control_chars(value: str) -> str:
    if _CONTROL_CHARS.search(value):
        raise ValueError(
            f"{shown_value(value)} contains control characters (a newline, tab or escape); write it on one line"
        )
    return value


def check_sweep_key(key: str) -> str:
    if key.split(".")[0] in ("name", "cluster", "output_dir", "resources", "sweep", "study", "launcher"):
        raise ValueError("only trainer/data/entrypoint_args/env keys can be swept (resources go in study:)")
    return key


def values_list(value: object) -> object:
    """A sweep's values are a list whatever YAML gave: a scalar, null or mapping gets the way out."""
    if isinstance(value, list):
        return value
    raise ValueError(
        f"must be a list of values such as [0.1, 0.2], not {shown_value(value)} "
        "(one value belongs in the key itself, outside sweep:)"
    )


def shown_value(value: object) -> str:
    """A value as a message quotes it: short, whatever its size."""
    return _REPR.repr(value) if value is not None else "null"


def check_non_empty(values: list[object]) -> list[object]:
    if not values:
        raise ValueError("needs at least one value")
    return values


def check_block_names(names: list[str]) -> list[str]:
    if len(set(names)) != len(names):
        raise ValueError("split points must be different blocks")
    return names


def script_arg_is_string(value: object) -> object:
    """A script argument is a string; YAML's numbers and booleans must be quoted to become one."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, int, float)) or value is None:
        word = "true" if value is True else "false" if value is False else "null" if value is None else str(value)
        raise ValueError(f'must be a string: quote it in YAML, "{word}" (got {type(value).__name__} {word})')
    raise ValueError(f"must be a string, one command-line word (got {type(value).__name__} {shown_value(value)})")


def check_script_text(value: str) -> str:
    """A script argument or workdir: its placeholders (jobspec/script_args.py) are well-formed and known."""
    from hpctrain.jobspec.script_args import check_text

    return check_text(value)


def safe_path(value: str | None) -> str | None:
    if value is not None and _CONTROL_CHARS.search(value):
        raise ValueError("paths may not contain control characters or newlines")
    return value


# Mappings and lists whose every entry is checked on its own, so every bad entry is
# reported at once (a validator over the whole mapping stops at the first).
EnvMap = Annotated[
    dict[Annotated[str, Field(pattern=ENV_NAME_PATTERN)], Annotated[str, AfterValidator(check_no_control_chars)]],
    BeforeValidator(scalars_to_str),
]
NcclEnvMap = Annotated[
    dict[Annotated[str, Field(pattern=NCCL_NAME_PATTERN)], Annotated[str, AfterValidator(check_no_control_chars)]],
    BeforeValidator(scalars_to_str),
]
SlurmExtraMap = Annotated[
    dict[Annotated[str, Field(pattern=SLURM_OPTION_PATTERN)], Annotated[str, Field(pattern=SLURM_VALUE_PATTERN)]],
    BeforeValidator(scalars_to_str),
]
SweepKey = Annotated[str, AfterValidator(check_sweep_key)]
ScriptArg = Annotated[str, BeforeValidator(script_arg_is_string), AfterValidator(check_script_text)]
SweepValues = Annotated[list[object], BeforeValidator(values_list), AfterValidator(check_non_empty)]
SetupLines = list[Annotated[str, AfterValidator(check_setup_line)]]
BlockNames = Annotated[list[Annotated[str, Field(pattern=BLOCK_NAME_PATTERN)]], AfterValidator(check_block_names)]


# What each pattern allows, in words: the message when a value does not match it
# (spec/problems.py looks the pattern up here; a pattern without a rule is quoted).
PATTERN_RULES: dict[str, str] = {
    NAME_PATTERN: "may only contain letters, digits, '_', '.', '-' (at most 64, starting with a letter or digit)",
    ENV_NAME_PATTERN: "is not a valid environment variable name: letters, digits and '_', not starting with a digit",
    NCCL_NAME_PATTERN: "is not an NCCL variable: NCCL_* or TORCH_NCCL_* in capitals, digits and '_'",
    SLURM_OPTION_PATTERN: "is not an sbatch option name: write it like 'reservation' or 'mail-type' (no leading --)",
    SLURM_VALUE_PATTERN: "may only contain letters, digits and _ . , : = / @ % + - [ ] (no spaces or quotes)",
    SLURM_WORD_PATTERN: "may only contain letters, digits and _ . , : = / @ % + - [ ] & | ! ( ) *, "
    "and may not start with '-'",
    BLOCK_NAME_PATTERN: "is not a module name such as 'layer3' or 'features.7'",
    CONTAINER_IMAGE_PATTERN: "is not an image: write a reference or file such as nvcr.io#nvidia/pytorch:24.05-py3, "
    "docker://ubuntu:22.04 or /images/torch.sif (letters, digits and _ . : / # @ + -, not starting with '-')",
    CONTAINER_MOUNT_PATTERN: "is not a bind mount: write SRC[:DST[:ro|rw]] with absolute paths, e.g. "
    "/scratch/me:/scratch:ro (paths of letters, digits and _ . + @ % = / -; no ',' or spaces)",
    CONTAINER_OPTION_PATTERN: "is not a runtime flag: write one flag per entry such as --nv, --no-privs or "
    "--drop-caps=CAP_SYS_RESOURCE (a value joined with '=': letters, digits and _ . , : = / @ % + -)",
    MODULE_PATTERN: "is not a module name such as 'mypkg.train' (dotted Python identifiers)",
    LOGIN_HOST_PATTERN: "is not a host name: letters, digits and _ . : -, not starting with '-' or '.'",
    LOGIN_USER_PATTERN: "is not an account name: letters, digits and _ . -, not starting with '-' or '.'",
    LOGIN_JUMP_PATTERN: "is not a jump host: write [user@]host[:port], several joined with ',' (ssh -J)",
    SSH_TIME_PATTERN: "is not an ssh time: write e.g. 8h, 30m, 1d or 3600 (seconds)",
    CONTAINER_PYTHON_PATTERN: "is not an interpreter: write a name or path such as python3 or /opt/conda/bin/python "
    "(letters, digits and _ . / + -, not starting with '-')",
}
