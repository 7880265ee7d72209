"""Each process of a run takes its share of the cores (``--threads N`` sets it); a local run
follows the idle cores, and with compiled stages chooses its threads once."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch._dynamo
from torch import nn
from torch._dynamo.utils import counters

from pipecompile.codegen.emit import ModelRef, emit
from pipecompile.compiler import compile_model
from pipecompile.model.data_hooks import iterable_source
from pipecompile.options.run import TrainFlags
from pipecompile.runtime.pipeline import Pipeline
from pipecompile.runtime.process import notes, threads
from pipecompile.runtime.process.machine_load import Reading
from pipecompile.runtime.torch_compiled import CompiledStages
from pipecompile.runtime.training.loop import train
from pipecompile.surfaces.cli import main
from tests.conftest import EXAMPLES


@pytest.fixture
def restored():  # type: ignore[no-untyped-def]
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_fair_share_divides_the_cores_and_never_falls_to_zero(monkeypatch):
    monkeypatch.setattr(threads, "cores", lambda: 16)
    assert [threads.fair_share(k) for k in (1, 2, 3, 4, 32)] == [16, 8, 5, 4, 1]
    monkeypatch.setattr(threads, "cores", lambda: 2)
    assert threads.fair_share(4) == 1


def test_run_nproc_takes_threads_given_then_the_callers_omp_count_then_the_share(monkeypatch):
    monkeypatch.setattr(threads, "cores", lambda: 16)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert threads.launch_threads(None, 2) == 8
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # eight runs at once on 16 cores, say
    assert threads.launch_threads(None, 1) == 2
    assert threads.launch_threads(3, 1) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "many")  # not a count: the share
    assert threads.launch_threads(None, 4) == 4


def test_use_threads_sets_the_given_count_or_the_share(monkeypatch, restored):
    monkeypatch.setattr(threads, "cores", lambda: 4)
    assert threads.use_threads(None, 2) == 2
    assert threads.use_threads(3, 2) == 3  # given beats the share
    assert threads.use_threads(None, None) == 3  # one process, nothing given: untouched


def test_run_threads_sets_the_local_runs_threads(tmp_path: Path, restored):
    out = tmp_path / "out"
    assert main([str(EXAMPLES / "mlp.py"), "--stages", "2", "-q", "-o", str(out)]) == 0
    torch.set_num_threads(2)
    assert main(["run", str(out), "--steps", "1", "-q", "--threads", "1"]) == 0
    assert torch.get_num_threads() == 1


def _samples(monkeypatch, others_per_step: list[float]) -> None:
    """Fake /proc/stat samples: each step lasts 1 s, this process uses 1 core-second and the
    others ``others_per_step[k]`` core-seconds."""
    clock = {"k": 0, "wall": 0.0, "busy": 0.0, "own": 0.0}

    def sample():  # type: ignore[no-untyped-def]
        k = clock["k"]
        if k > 0:
            clock["wall"] += 1.0
            clock["own"] += 1.0
            clock["busy"] += 1.0 + others_per_step[k - 1]
        clock["k"] += 1
        return Reading(clock["wall"], clock["busy"], clock["own"], 0.0)

    monkeypatch.setattr(threads, "_sample", sample)


def test_a_local_run_gives_up_the_cores_others_keep_busy_and_takes_them_back(monkeypatch, restored):
    monkeypatch.setattr(threads, "cores", lambda: 4)
    monkeypatch.setattr(threads, "_given", False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "_STAT", Path(__file__))  # exists
    _samples(monkeypatch, [0.1, 1.0, 2.6, 0.0])
    said: list[str] = []
    torch.set_num_threads(4)
    idle = threads.IdleCores(said.append)
    assert [idle.between_steps() for _ in range(4)] == [4, 3, 1, 4]
    assert torch.get_num_threads() == 4
    assert said[0] == "other programs keep 1.0 of 4 cores busy: 3 threads from the next step"
    assert len(said) == 3
    torch.set_num_threads(1)
    idle.restore()  # the end of the run: fit()'s caller gets its own count back
    assert torch.get_num_threads() == 4


def test_a_given_thread_count_is_kept_however_busy_the_machine(monkeypatch, restored):
    monkeypatch.setattr(threads, "cores", lambda: 4)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    _samples(monkeypatch, [3.0, 3.0])
    threads.use_threads(2)
    idle = threads.IdleCores()
    assert [idle.between_steps() for _ in range(2)] == [2, 2]
    threads.use_threads(None)  # a later run without --threads follows the cores again
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # ... unless the user fixed them
    assert not threads.IdleCores().on


def _two_stages(tmp_path: Path) -> Pipeline:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4))
    compiled = compile_model(model, {"input": torch.randn(4, 8)}, stages=2, microbatches=2)
    return Pipeline.load(emit(compiled, tmp_path / "o", model=ModelRef(None, "m", "m")))


def test_compiled_stages_keep_the_thread_count_they_are_compiled_with(
    tmp_path, monkeypatch, restored
):
    """Dynamo guards compiled code on the thread count: the threads are chosen once, before the
    first compiled call, so each stage compiles once however busy the machine gets."""
    monkeypatch.setattr(threads, "cores", lambda: 4)
    monkeypatch.setattr(threads, "_given", False)
    monkeypatch.setattr(threads, "SETTLE_S", 0.0)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "_STAT", Path(__file__))  # exists
    _samples(monkeypatch, [0.0, 2.6, 0.0, 0.0, 3.0, 0.0])  # idle, busy, idle, busy
    said: list[str] = []
    monkeypatch.setattr(notes, "note", said.append)
    seen: list[int] = []  # the threads in effect at each compiled stage call
    call = CompiledStages.call
    monkeypatch.setattr(
        CompiledStages,
        "call",
        lambda *a, **k: seen.append(torch.get_num_threads()) or call(*a, **k),
    )
    g = torch.Generator().manual_seed(1)
    batches = [
        ((torch.randn(4, 8, generator=g),), (torch.randn(4, 4, generator=g),)) for _ in range(4)
    ]
    torch.set_num_threads(4)
    torch._dynamo.reset()
    counters.clear()
    train(
        _two_stages(tmp_path),
        lambda out, target: nn.functional.mse_loss(out, target),
        iterable_source(batches, ["input"], "batches"),
        TrainFlags(steps=4, compile="eager"),
        eval_data=iterable_source(batches[:2], ["input"], "eval batches"),
    )
    torch._dynamo.reset()
    # each stage: once with gradients (training), once without (evaluation)
    assert counters["stats"]["unique_graphs"] == 4
    assert set(seen) == {1} and len(seen) > 8  # every step and the evaluations
    chosen = [line for line in said if "for the whole run" in line]
    assert chosen == [
        "other programs keep 2.6 of 4 cores busy; 1 thread for the whole run: compiled stages "
        "keep the thread count they are compiled with (a change would compile them again)"
    ]
