"""``--save-every N --async-save``: each save's state is copied off the training tensors at the
step (torch.distributed.checkpoint's staging) and written in the background while training
goes on (its ``async_save``, on a process group of its own so that its collectives never meet
the training's).

At most one save is in flight: the next save, and the end of the run, wait for it first. Rank
0 moves ``latest`` only once the write is complete: its future ends after every rank's share
and the index are written, and then it writes ``meta.json``, renames ``.step_<n>.tmp`` into
``step_<n>`` and replaces ``latest``, as a synchronous save does. A write that fails is raised
at the next wait (the run fails as a synchronous save would); one abandoned by a stop is never
published, and its files are removed once its writes end. Either way ``latest`` stays on the
previous complete step.
"""

from __future__ import annotations

import threading
import time
import warnings
from pathlib import Path
from typing import Any

import torch.distributed as dist

from pipecompile.files.disk import disk_message, writing
from pipecompile.files.names import step_name
from pipecompile.runtime.pipeline import Pipeline
from pipecompile.runtime.process.faults import fail_save
from pipecompile.runtime.training.model_keyed import save_model_keyed_async
from pipecompile.runtime.training.train_state import (
    LoopState,
    StepMeta,
    last_complete,
    publish,
    remove_partial,
    step_meta,
)

__all__ = ["BackgroundSaves"]


class BackgroundSaves:
    """A run's saves written in the background, one at a time."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._abandoned = False
        self._group: Any = None
        self._where: tuple[Path, int] | None = None  # the save in flight's root and rank

    def submit(self, pipe: Pipeline, root: Path, step: int, rank: int, train: LoopState) -> float:
        """Start the save of ``step`` (every rank together); returns the seconds the step
        waited: for the previous save, then for the copy."""
        began = time.perf_counter()
        self.wait()
        tmp = root / f".{step_name(step)}.tmp"
        if rank == 0:
            root.mkdir(parents=True, exist_ok=True)
            remove_partial(root)  # left by a save that was killed
            tmp.mkdir()
        distributed = dist.is_available() and dist.is_initialized()
        if distributed:
            if self._group is None:  # collective: every rank makes it at its first save
                self._group = dist.new_group(backend="gloo")
            dist.barrier()
        else:  # torch's note that one process saves alone, raised in its writing thread
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        meta = step_meta(pipe, step, train)
        with writing("save the train state to", root):
            future = save_model_keyed_async(pipe, tmp, self._group if distributed else None)
        self._where = root, rank
        self._thread = threading.Thread(
            target=self._finish,
            args=(future, root, tmp, meta, rank),
            name=f"pipecompile-save-{step}",
            daemon=True,
        )
        self._thread.start()
        return time.perf_counter() - began

    def wait(self) -> None:
        """Until the save in flight is complete and published; raises its failure."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    def abandon(self, seconds: float = 60.0) -> None:
        """A stop: the save in flight is not published; waits up to ``seconds`` for its
        writes to end, then rank 0 removes what it wrote (``remove_partial``; a write still
        going on after that is left to the next save's)."""
        self._abandoned = True
        thread, self._thread = self._thread, None
        if thread is None:
            return
        thread.join(seconds)
        if not thread.is_alive() and self._where is not None and self._where[1] == 0:
            remove_partial(self._where[0])

    def _finish(self, future: Any, root: Path, tmp: Path, meta: StepMeta, rank: int) -> None:
        def failed(cause: OSError) -> str:
            line = disk_message(f"write train state {step_name(meta['step'])} to", root, cause)
            return f"{line}; {last_complete(root)}"

        try:
            with writing("save the train state to", root, message=failed):
                future.result()
                fail_save(rank, meta["step"])  # a test's injected failure, if one is set here
                if rank == 0 and not self._abandoned:
                    publish(root, tmp, meta)
        except BaseException as err:  # raised on the training's thread at the next wait
            self._failure = err
            if rank == 0:
                remove_partial(root)  # what this save wrote; `latest` is untouched
