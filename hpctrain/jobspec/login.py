"""A cluster profile's ``login:`` section: the login node a laptop reaches over SSH. Torch-free.

With it every verb can run from a laptop (``hpctrain/remote/``): one OpenSSH
connection per cluster, opened once with the password and one-time code,
reused by every later command. Only what ``ssh`` needs is here; host keys,
identities and agents stay the user's own ssh configuration's business.
"""

from __future__ import annotations

import shlex
from typing import Annotated

from pydantic import Field, field_validator

from hpctrain.jobspec.fields import (
    LOGIN_HOST_PATTERN,
    LOGIN_JUMP_PATTERN,
    LOGIN_USER_PATTERN,
    SSH_TIME_PATTERN,
)
from hpctrain.jobspec.section import Section


class LoginHost(Section):
    """How to reach the cluster's login node; unset keys are left to ``~/.ssh/config``."""

    host: Annotated[str, Field(pattern=LOGIN_HOST_PATTERN, description="login node, e.g. hal.ncsa.illinois.edu")]
    user: Annotated[str | None, Field(pattern=LOGIN_USER_PATTERN, description="account on the cluster")] = None
    port: Annotated[int | None, Field(ge=1, le=65535)] = None
    jump: Annotated[str | None, Field(pattern=LOGIN_JUMP_PATTERN, description="ssh -J: [user@]host[:port],...")] = None
    ssh_config: Annotated[str | None, Field(description="an ssh_config file to use instead of ~/.ssh/config")] = None
    persist: Annotated[
        str, Field(pattern=SSH_TIME_PATTERN, description="how long the one connection stays open unused (ssh time)")
    ] = "8h"
    hpctrain: Annotated[
        str, Field(description="the command that runs hpctrain on the login node, e.g. '~/venv/bin/hpctrain'")
    ] = "hpctrain"

    @field_validator("hpctrain")
    @classmethod
    def _command(cls, value: str) -> str:
        try:
            words = shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"not a command line: {exc}") from None
        if not words or any(ord(ch) < 32 for ch in value):
            raise ValueError("must name a command, on one line")
        return value

    @field_validator("ssh_config")
    @classmethod
    def _config(cls, value: str | None) -> str | None:
        if value is not None and (not value or any(ord(ch) < 32 for ch in value)):
            raise ValueError("must be a path on one line")
        return value

    def command_words(self) -> list[str]:
        return shlex.split(self.hpctrain)
