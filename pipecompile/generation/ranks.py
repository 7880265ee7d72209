"""Generation with one rank per stage (`generate --nproc N`): this process is rank 0 (the
prompt queue, the lanes' bookkeeping and stage 0), and starts ranks 1..N-1 on this machine.
Each rank runs its stage's part of the prefill and decode programs: a lane's turn goes
down the stages as hidden states, the last stage samples and sends only the token ids back
to rank 0, and the KV cache never leaves its stage's rank. With as many lanes as stages in
flight every stage has work while the others run theirs.

The ranks talk by torch.distributed point-to-point messages in a gloo group of their own
(NCCL beside it between two GPUs: ``generation.wire``) that meets through a TCP store of its
own, so a caller that runs torch.distributed itself is not disturbed. A rank that fails ends
the call with its last line; the others are stopped, and none outlives this process. Ranks
started by torchrun run the same turns (``surfaces.generate_worker``)."""

from __future__ import annotations

import os
import tempfile
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pipecompile.errors import RuntimeFailure
from pipecompile.generation.children import Children
from pipecompile.generation.job import GenerateJob
from pipecompile.generation.lanes import Lanes, Turn
from pipecompile.generation.places import stage_device
from pipecompile.generation.rank_model import WeightSource
from pipecompile.generation.stages import Call, DecodeStage, Rows
from pipecompile.generation.wire import PeerGone, Wire, connect
from pipecompile.options.fields import to_record
from pipecompile.runtime.process.faults import FAULT_ENV, fault_at, happen

__all__ = ["generate_on_ranks", "run_stage"]

_TURN, _STOP = 1, 0


def _describe(turn: Turn) -> torch.Tensor:
    """A turn as int64s: lane, calls, then per call rows, tokens, its rows, sequences and
    positions."""
    out = [turn.lane, len(turn.calls)]
    for call, seqs in zip(turn.calls, turn.sequences):
        pos = call.rows.positions
        out += [len(call.rows.rows), int(pos.shape[1]), *call.rows.rows, *seqs]
        out += [int(p) for p in pos.flatten()]
    return torch.tensor(out, dtype=torch.long)


def _read(raw: torch.Tensor) -> tuple[int, list[Call], list[list[int]]]:
    v = raw.tolist()
    lane, count, k = v[0], v[1], 2
    calls, sequences = [], []
    for _ in range(count):
        n, tokens = v[k], v[k + 1]
        k += 2
        rows, seqs = tuple(v[k : k + n]), v[k + n : k + 2 * n]
        k += 2 * n
        pos = torch.tensor(v[k : k + n * tokens], dtype=torch.long).view(n, tokens)
        k += n * tokens
        calls.append(Call(Rows(rows, pos)))
        sequences.append(seqs)
    return lane, calls, sequences


def _send_turn(wire: Wire, description: torch.Tensor, hidden: list[torch.Tensor]) -> None:
    wire.send([torch.tensor([_TURN]), description, *hidden])


def run_stage(stage: DecodeStage, wire: Wire, sampler: Any) -> None:
    """Ranks 1..N-1: run each turn that comes, until the stop comes (and pass it on)."""
    from pipecompile.generation.sampler import picked

    last = stage.index == stage.count - 1
    turns = 0
    while True:
        kind, *rest = wire.recv()
        turns += 1
        _fault(stage.index, turns)
        if int(kind[0]) == _STOP:
            if not last:
                wire.send([torch.tensor([_STOP])])
            wire.flush()
            return
        description, *hidden = rest
        lane, calls, sequences = _read(description)
        outs = stage.run(lane, calls, hidden)
        if last:
            tokens = picked(sampler, outs, sequences)
            wire.send([torch.tensor([lane, *tokens], dtype=torch.long)])
        else:
            _send_turn(wire, description, outs)


def _fault(rank: int, turn: int) -> None:
    """``PIPECOMPILE_FAULT=RANK:TURN:turn:KIND`` (runtime.faults) fails this rank at its
    TURN-th message, as the tests kill or hang a rank."""
    if not os.environ.get(FAULT_ENV):
        return
    fault = fault_at(rank, turn, "turn")
    if fault is not None:
        happen(fault, f"at turn {turn}")


def lead(stage: DecodeStage, wire: Wire, book: Lanes) -> None:
    """Rank 0: every lane's turn in order, each lane's next turn once its tokens are back,
    until every sequence ended; then the stop goes round. Tokens come back in the order the
    turns went out; those already here are taken between turns, so the first ones reach the
    caller while the later lanes' prefills still run."""
    flying: deque[Turn] = deque()
    while not book.done() or flying:
        for lane in range(stage.lanes):
            while flying and (any(t.lane == lane for t in flying) or wire.ready()):
                _tokens_back(wire, book, flying.popleft())
            turn = book.turn(lane)
            if turn is None:
                continue
            outs = stage.run(lane, turn.calls, turn.ids)
            _send_turn(wire, _describe(turn), outs)
            flying.append(turn)
    wire.send([torch.tensor([_STOP])])
    wire.flush()


def _tokens_back(wire: Wire, book: Lanes, turn: Turn) -> None:
    (got,) = wire.recv()
    if int(got[0]) != turn.lane:
        raise RuntimeFailure(f"tokens of lane {int(got[0])} came for lane {turn.lane}")
    book.give(turn, got[1:].tolist())


def _weights_source(
    directory: Path,
    manifest: Any,
    job: GenerateJob,
    weights: Callable[[], dict[str, torch.Tensor]] | None,
    tmp: Path,
) -> WeightSource:
    """Where every rank reads its stage's weights: a run's train state, the directory's own
    stage files, or (weights given in memory: a pipeline trained since it was saved) a file
    of them written here."""
    if job.train_state is not None:
        return WeightSource("train_state", Path(job.train_state))
    if weights is None:
        return WeightSource("directory", directory, manifest)
    from safetensors.torch import save_file

    path = tmp / "weights.safetensors"
    save_file({k: v.detach().contiguous().clone() for k, v in weights().items()}, str(path))
    return WeightSource("file", path)


def generate_on_ranks(
    directory: Path,
    manifest: Any,
    plan: Any,
    job: GenerateJob,
    weights: Callable[[], dict[str, torch.Tensor]] | None,
    on_token: Callable[[int, int], None] | None = None,
    on_start: Callable[[], None] | None = None,
) -> dict[int, list[int]]:
    """Rank 0 here, ranks 1..N-1 started beside it; each prompt's new tokens by its number.
    Every rank holds only its own stage's modules and weights (``generation.rank_model``).

    Raises:
        RuntimeFailure: a rank failed or was killed: names it and its last line; the other
            ranks are stopped.
    """
    from pipecompile.generation.rank_model import rank_stage
    from pipecompile.runtime.process.threads import launch_threads

    n = plan.stages
    with tempfile.TemporaryDirectory(prefix="pipecompile-generate-") as tmp:
        source = _weights_source(directory, manifest, job, weights, Path(tmp))
        store = torch.distributed.TCPStore("127.0.0.1", 0, n, True, wait_for_workers=False)
        threads = launch_threads(job.threads, n)  # --threads, else each rank its share
        children = Children(
            {
                "directory": str(directory),
                "port": store.port,
                "world": n,
                "source": source.to_json(),
                "threads": threads,
                "flags": to_record(job.flags) if job.flags is not None else {},
            }
        )
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            where = stage_device(job.device, 0)
            wire = connect(store, 0, n, children.poll, job.timeout, where)
            stage = rank_stage(directory, plan, 0, source, where)
            book = Lanes(
                job.prompts,
                plan.lanes,
                plan.rows,
                job.max_new_tokens,
                job.eos,
                on_token,
                on_start,
            )
            try:
                lead(stage, wire, book)
            except PeerGone:
                children.ended(grace=2.0)  # a rank that died is named, not the broken socket
                raise
            children.ended(grace=60.0)
        finally:
            children.close()
            torch.set_num_threads(before)
        return book.finished
