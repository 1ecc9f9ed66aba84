"""Step time of strategy: ps (sync, 1 server + W workers) against ddp over W ranks, same global batch.

Both runs are the trainer on local gloo ranks (tests/local/ps_harness.py), resnet18 on the test
dataset's 32 px images, batch 8 per worker/rank, one thread per process. Prints the mean step time
of each (from metrics.jsonl, first log window dropped) and the ratio ps / ddp. Usage:

    .venv/bin/python benchmarks/ps_step_time.py [WORKERS] [STEPS]
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "local"))

from ps_harness import run_ranks  # noqa: E402
from trainer_harness import make_data  # noqa: E402


def mean_step_s(run_dir: Path) -> float:
    windows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [w["step_s"] for w in windows if w.get("kind") == "train_step"][1:]  # first window: warm-up
    return sum(steps) / len(steps)


def main() -> None:
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        data = make_data(base / "data")
        settings = {"epochs": 1, "max_steps_per_epoch": steps, "deterministic": False}
        for strategy, world in (("ddp", workers), ("ps", workers + 1)):
            run_ranks(
                "ddp", world, base / f"out-{strategy}", strategy=strategy, data_root=str(data), base_dir=tmp, **settings
            )
        ddp, ps = mean_step_s(base / "ddp"), mean_step_s(base / "ps")
    print(f"ddp  {workers} ranks:              {ddp:.3f} s/step")
    print(f"ps   1 server + {workers} workers:  {ps:.3f} s/step")
    print(f"ratio ps / ddp: {ps / ddp:.2f}")


if __name__ == "__main__":
    main()
