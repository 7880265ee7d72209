"""Fuzz pipecompile with random models: generate, compile, run the pipeline, compare with eager.

Each seed makes one random model and one random compile configuration. The model is a DAG of
ops over a pool of live values of known shapes (float, integer and boolean, with or without
the batch dimension); every op picks values that fit, so the model always runs eagerly. It is
written as a model file (``build_model``, ``example_inputs``, ``example_targets``,
``loss_fn``), which ``--show`` prints and ``pipecompile run`` reads. The configuration picks
the stages (1-4, at most the ops), the schedule (``interleaved`` with an even stage count),
the micro-batches (1, 2 or 4 of a batch of 8) and the recompute policy.

The ops (``fuzzing.ops.OPS``, each a function that returns False when no live value fits):
Linear (shared or with a frozen weight), activations (functional, methods, modules), in-place writes
(``relu_``, ``nn.ReLU(inplace=True)``, ``F.relu(inplace=True)``, ``add_``, ``+=``, ``mul_``,
``masked_fill_``, ``x[mask] = 0``; only where eager autograd allows them), residual adds,
sigmoid gates, cat, chunk, split, LayerNorm, BatchNorm1d/2d in training, Conv1d/2d, max and
average pooling, flatten and unflatten by shape arithmetic (``x.view(x.size(0), -1)``),
transposes, Embedding (of ids, of ``arange`` positions), a head tied to an embedding, attention
(1-2 heads, causal or padding masks, softmax), boolean masks, ``masked_fill``/``where``,
integer values (cumsum, remainder, argmax, arange), bare parameters and values made from them,
buffers (persistent or not; a counter and a running mean mutated in forward), constants,
reductions, dropout with p=0, ``torch.no_grad()`` regions, a Python branch on a shape (which
sends the model to torch.export), submodules with children (a Block class, nn.Sequential, an
nn.ModuleList loop) and parameters, buffers or submodules forward never reads. Inputs: 1-3
floats, ids or masks, maybe one unused, passed as a dict or a tuple, maybe a parameter left at
its default; outputs: one tensor, a tuple or a dict, with the dead ends summed into one more,
sometimes an integer, a model input or the same value twice.

Every model goes through ``compile_model``, ``emit``, ``Pipeline.load`` of the emitted stage
files and ``check_step`` (``check_async_step`` for ``pipedream``) with ``atol = rtol = 1e-5``;
for a synchronous schedule every buffer after the step is also compared with the eager model
run micro-batch after micro-batch, as the stages run them. With ``--distributed-every K``
every K-th model that matched also runs ``pipecompile run OUT --nproc N --check``. The outcome
is one of:

* matched: the pipeline's loss, outputs, gradients (or weights) and buffers equal eager's;
* refused: compile failed with a clear pipecompile error (its class and the first words of
  its message are the reason key);
* internal: an ``InternalError``, any other exception, any failure after a successful compile,
  or a hang: a bug (a cause listed in ``fuzzing.run.KNOWN`` is named as such);
* mismatch: the check failed: the worst bug;
* invalid: the generated model itself did not run eagerly: a bug of this tool.

With ``--peer`` every model also goes through ``torch.distributed.pipelining``
(``fuzzing.peer``): ``pipeline()`` with split points at the model's submodules for the same
stage count, then its split graph forward and backward on the first micro-batch, compared with
eager (this compares tracing and splitting, not schedules). The summary gets a second block
with the peer's verdicts and reasons, and how many models it cut into fewer stages than asked.

Usage::

    python tools/qa/fuzz.py --quick                       # a few models, a few seconds
    python tools/qa/fuzz.py --count 200 --seed 1000 --jobs 2
    python tools/qa/fuzz.py --seed 1017 --show            # replay one seed: source and traceback
    python tools/qa/fuzz.py --count 2000 --jobs 2 --distributed-every 200
    python tools/qa/fuzz.py --count 200 --no-inplace      # no in-place ops (another model set)
    python tools/qa/fuzz.py --count 200 --jobs 2 --peer   # and torch.distributed.pipelining
    python tools/qa/fuzz.py --seed 1017 --show --peer     # one seed through both

The exit status is 1 when any model is internal, mismatch or invalid in pipecompile; the
peer's verdicts do not count.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import multiprocessing
import signal
import sys
import time
import warnings
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the fuzzing package beside this file

from fuzzing.generate import POLICIES, SCHEDULES, generate  # noqa: E402
from fuzzing.peer import PEER, PeerOutcome, run_peer  # noqa: E402
from fuzzing.run import Outcome, classify, eager_step, run_case  # noqa: E402

__all__ = [
    "PEER",
    "POLICIES",
    "SCHEDULES",
    "Outcome",
    "PeerOutcome",
    "classify",
    "eager_step",
    "generate",
    "peer_case",
    "run_case",
    "run_peer",
]
VERDICTS = ("matched", "refused", "internal", "mismatch", "invalid")


@dataclass(frozen=True)
class Plan:
    """What the worker processes run for each seed."""

    inplace: bool
    distributed_every: int
    first: int
    peer: bool = False


def _work(item: tuple[int, Plan]) -> Outcome:
    seed, plan = item
    every = plan.distributed_every
    distributed = every > 0 and (seed - plan.first) % every == every - 1
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        outcome = run_case(seed, inplace=plan.inplace, distributed=distributed)
        if plan.peer:
            outcome.peer = peer_case(outcome, inplace=plan.inplace)
        return outcome


def peer_case(outcome: Outcome, *, inplace: bool = True) -> PeerOutcome:
    """``outcome``'s model through torch.distributed.pipelining (invalid, without running it,
    when the model could not be generated)."""
    if outcome.verdict == "invalid" and outcome.phase == "generate":
        return PeerOutcome(outcome.seed, "invalid", key=outcome.key)
    return run_peer(generate(outcome.seed, inplace=inplace))


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the pool


def run_many(seeds: list[int], plan: Plan, *, jobs: int, progress: bool = True) -> list[Outcome]:
    """Every seed's outcome, in seed order, computed by ``jobs`` processes."""
    items = [(seed, plan) for seed in seeds]
    outcomes: list[Outcome] = []
    if jobs <= 1:
        iterator: Iterable[Outcome] = map(_work, items)
        pool = None
    else:
        pool = multiprocessing.get_context("spawn").Pool(jobs, initializer=_init_worker)
        iterator = pool.imap_unordered(_work, items)
    try:
        for outcome in iterator:
            outcomes.append(outcome)
            if progress:
                _progress(outcome, len(outcomes), len(items))
    except BaseException:
        if pool is not None:
            pool.terminate()
        raise
    if pool is not None:
        pool.close()
        pool.join()
    return sorted(outcomes, key=lambda o: o.seed)


def _progress(outcome: Outcome, done: int, total: int) -> None:
    if outcome.verdict not in ("matched", "refused"):
        print(f"  seed {outcome.seed}: {outcome.verdict} [{outcome.phase}] {outcome.key}")
    peer = outcome.peer
    if peer is not None and peer.verdict not in ("matched", "refused"):
        print(f"  seed {outcome.seed}: {PEER} {peer.verdict} {peer.key}")
    if done % 100 == 0 or done == total:
        print(f"  ... {done}/{total}", file=sys.stderr, flush=True)


def summary(outcomes: list[Outcome], *, flags: str = "") -> str:
    """Counts by verdict, refusals and failures by reason, every failure's seed."""
    lines = [f"{len(outcomes)} models", *_verdict_lines(outcomes)]
    dist = [o for o in outcomes if o.distributed]
    if dist:
        counts = Counter(o.distributed for o in dist)
        lines.append(
            f"  distributed --nproc runs: {len(dist)} "
            + ", ".join(f"{v} {n}" for v, n in sorted(counts.items()))
        )
    bad = [o for o in outcomes if o.verdict in ("internal", "mismatch", "invalid")]
    if bad:
        lines.append(f"replay: python tools/qa/fuzz.py --seed SEED --show{flags}")
    peers = [o.peer for o in outcomes if o.peer is not None]
    if peers:
        lines.append(peer_summary(peers, flags=flags))
    return "\n".join(lines)


def _verdict_lines(outcomes: list[Outcome] | list[PeerOutcome]) -> list[str]:
    """A count per verdict, and under each but matched its reasons, most common first, with
    their seeds (only for the rarer refusals)."""
    verdicts = Counter(o.verdict for o in outcomes)
    lines = []
    for verdict in VERDICTS:
        lines.append(f"  {verdict:<9}{verdicts.get(verdict, 0):>6}")
        group = [o for o in outcomes if o.verdict == verdict]
        if verdict == "matched" or not group:
            continue
        by_key = Counter(o.key for o in group)
        for key, n in by_key.most_common():
            seeds = [o.seed for o in group if o.key == key]
            shown = ", ".join(map(str, seeds[:8])) + (" ..." if len(seeds) > 8 else "")
            lines.append(f"    {n:>5}  {key}")
            if verdict != "refused" or n <= 3:
                lines.append(f"           seeds {shown}")
    return lines


def peer_summary(peers: list[PeerOutcome], *, flags: str = "") -> str:
    """The peer's block: verdicts and reasons, and the models split into fewer stages."""
    lines = [f"{PEER} (tracing and splitting, first micro-batch): {len(peers)} models"]
    lines += _verdict_lines(peers)
    split = [p for p in peers if p.stages]
    fewer = [p for p in split if p.stages < p.wanted]
    if split:
        lines.append(
            f"  stages as asked: {len(split) - len(fewer)} of {len(split)} split models; "
            f"fewer: {len(fewer)} (1 stage: {sum(p.stages == 1 for p in fewer)}), "
            f"more: {sum(p.stages > p.wanted for p in split)}"
        )
    if any(p.verdict in ("internal", "mismatch", "invalid") for p in peers):
        lines.append(f"replay: python tools/qa/fuzz.py --seed SEED --show --peer{flags}")
    return "\n".join(lines)


def feature_table(outcomes: list[Outcome]) -> str:
    """Per feature: how many models used it and how many of them matched."""
    used, matched = Counter[str](), Counter[str]()
    for o in outcomes:
        for f in o.features:
            used[f] += 1
            matched[f] += o.verdict == "matched"
    rows = [f"  {n:>5} {matched[f]:>5}  {f}" for f, n in sorted(used.items())]
    return "\n".join(["features: models / matched", *rows])


def show(seed: int, *, inplace: bool, distributed: bool = False, peer: bool = False) -> int:
    """Print one seed's model file, configuration and full outcome (``distributed``: with the
    ``pipecompile run --nproc N --check`` run too; ``peer``: and the peer's outcome)."""
    case = generate(seed, inplace=inplace)
    print(case.source)
    print(f"# config: {case.config}; {case.ops} ops")
    outcome = run_case(seed, inplace=inplace, distributed=distributed)
    print(f"# outcome: {outcome.verdict} [{outcome.phase}] {outcome.key}")
    if outcome.detail:
        print(outcome.detail)
    if peer:
        theirs = peer_case(outcome, inplace=inplace)
        print(f"# {PEER}: {theirs.verdict} {theirs.key}; {theirs.stages} of {theirs.wanted} stages")
        if theirs.detail:
            print(theirs.detail)
    return 0 if outcome.verdict in ("matched", "refused") else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100, help="how many seeds (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--quick", action="store_true", help="a few models, a few seconds")
    parser.add_argument("--show", action="store_true", help="print --seed's model and outcome")
    parser.add_argument("--no-inplace", action="store_true", help="generate no in-place ops")
    parser.add_argument(
        "--distributed-every",
        type=int,
        default=0,
        metavar="K",
        help="every K-th model also runs `pipecompile run --nproc N --check`",
    )
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--features", action="store_true", help="print the feature table")
    parser.add_argument("--peer", action="store_true", help=f"also run every model through {PEER}")
    args = parser.parse_args(argv)
    if args.count < 1 or args.jobs < 1 or args.distributed_every < 0:
        parser.error("--count and --jobs must be at least 1, --distributed-every at least 0")
    try:
        import torch  # noqa: F401  (workers would fail one by one without it)
    except ImportError:
        print("fuzz: torch is not installed in this Python; activate the project's venv")
        return 2
    inplace = not args.no_inplace
    flags = " --no-inplace" if args.no_inplace else ""
    if args.show:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            distributed = args.distributed_every > 0
            return show(args.seed, inplace=inplace, distributed=distributed, peer=args.peer)
    count = 6 if args.quick else args.count
    seeds = list(range(args.seed, args.seed + count))
    plan = Plan(inplace, args.distributed_every, args.seed, args.peer)
    start = time.perf_counter()
    outcomes = run_many(seeds, plan, jobs=args.jobs)
    took = time.perf_counter() - start
    print(f"fuzz: seeds {seeds[0]}-{seeds[-1]}{flags}, {args.jobs} job(s), {took:.1f} s")
    print(summary(outcomes, flags=flags))
    if args.features:
        print(feature_table(outcomes))
    return 1 if any(o.verdict in ("internal", "mismatch", "invalid") for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
