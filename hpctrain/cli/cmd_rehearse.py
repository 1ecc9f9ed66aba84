"""``hpctrain rehearse SPEC``: prove a setup survives a time limit before the real run.

Thin: ``hpctrain.launch.rehearsal`` submits the job, forces one time-limit
requeue after its first checkpoint, checks that it resumed, and cancels it.
"""

from __future__ import annotations

import argparse
import json

from hpctrain.cli.main import warn
from hpctrain.jobspec.load import load_job
from hpctrain.launch.plan import spec_warnings
from hpctrain.launch.rehearsal import rehearse


def run(args: argparse.Namespace) -> int:
    job = load_job(args.spec, args.overrides)
    warn(spec_warnings(job))
    done = rehearse(job, args.timeout, say=print)
    print(f"3/3 rehearsal passed; cancelled it. Submit the real run with: hpctrain submit {args.spec}")
    print(
        json.dumps({"job_id": done.job_id, "run_dir": str(done.run_dir), "resumed_from_step": done.resumed_from_step})
    )
    return 0
