"""`pipecompile run OUT --nproc N`: start N ranks on this machine with torch's own launcher.

The ranks are `python -m torch.distributed.run --standalone --nproc-per-node N -m
pipecompile.runtime.worker OUT ...`. Rank 0's output is passed through; the launcher's own
chatter is dropped unless the run fails, in which case each rank's one-line reason is shown.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["launch"]


def launch(nproc: int, worker_args: list[str], *, keep: list | None = None) -> int:
    """Run the ranks; returns the worst rank status (0 ok, 1 check failed, 2 error, 3 stopped
    because another rank failed). ``keep`` receives each rank's status record (status, end
    time, and for an injected kill the instruction)."""
    with tempfile.TemporaryDirectory(prefix="pipecompile-run-") as status_dir:
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", "--monitor-interval=0.1",
            "-m", "pipecompile.runtime.worker", *worker_args,
        ]  # fmt: skip
        env = {**_environ(), "PIPECOMPILE_STATUS_DIR": status_dir, "OMP_NUM_THREADS": "1"}
        result = subprocess.run(command, env=env, stderr=subprocess.PIPE, text=True)
        ours = [ln for ln in result.stderr.splitlines() if ln.startswith("pipecompile:")]
        statuses, entries = {}, []
        for path in Path(status_dir).glob("rank*.json"):
            entry = json.loads(path.read_text())
            statuses[entry["rank"]] = entry["status"]
            entries.append(entry)
        if keep is not None:
            keep.extend(entries)
    for line in ours:
        print(line, file=sys.stderr)
    if result.returncode == 0 and len(statuses) == nproc and not any(statuses.values()):
        return 0
    missing = sorted(set(range(nproc)) - set(statuses))
    if missing:
        print(f"pipecompile: rank(s) {', '.join(map(str, missing))} ended without a status "
              "(killed?)", file=sys.stderr)  # fmt: skip
    if not ours and result.returncode:
        print(result.stderr[-4000:], file=sys.stderr)
    worst = max(statuses.values(), default=2)
    return 1 if worst == 1 and not missing else 2  # 3 (stopped for a peer) is an error too


def _environ() -> dict[str, str]:
    import os

    return dict(os.environ)
