"""``trainer.strategy: horovod``: refused, with why and what to use instead; never imports torch or horovod.

hpctrain has no Horovod driver: Horovod's last release (0.28.1, June 2023)
does not build against the torch hpctrain installs (its CMake pins C++14,
torch's headers need C++20; the attempts are recorded in docs/strategies.md).
``validate`` and ``submit`` say so on the login node, looking Horovod up with
``importlib.util.find_spec`` only, and the trainer refuses too.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

INSTALL_COMMAND = (
    "HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 "
    "HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo pip install --no-build-isolation --no-cache-dir horovod"
)
ALTERNATIVE = "use trainer.strategy: ddp (the same synchronous all-reduce data parallelism, through NCCL or gloo)"


def horovod_refusal(find_spec: Callable[[str], object] = importlib.util.find_spec) -> str:
    """Why ``strategy: horovod`` cannot run here, and what to do (the installed case differs only in its reason)."""
    if find_spec("horovod") is None:
        reason = (
            "Horovod is not installed, and its last release (0.28.1) does not build against this torch "
            f"(C++14 build vs torch's C++20 headers; see docs/strategies.md#horovod). The install that was tried: "
            f"{INSTALL_COMMAND}"
        )
    else:
        reason = "Horovod is installed, but hpctrain has no Horovod driver (see docs/strategies.md#horovod)"
    return f"{reason}; {ALTERNATIVE}"
