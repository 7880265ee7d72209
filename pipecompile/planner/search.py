"""The plan search: every plan for N devices the options leave open, each predicted exactly
(``Predictor``), ranked by predicted step.

A plan is offered up to N devices: the replicable schedules (``REPLICABLE``: one stage per
device) take 1 to N stages and the partitioner spreads devices over them as replicas (it
leaves one idle where a replica's gradient all-reduce would cost more than it saves); the
looped schedules (``LOOPED``) put ``v`` stages on each of 2 to N devices (v = 2 and 4 unless
`--virtual-stages`), the V-shaped ones (``V_SHAPED``) two, and the others one stage on each
of 1 to N: a small model may be fastest on fewer devices than offered.
Micro-batch counts are the divisors of the batch (or the one given). Without a memory limit
only ``--recompute never`` is tried: recomputation only adds time, so a plan that recomputes
is never faster than the same plan without.

Each plan is priced by the cost model of the ranks it runs on (``RankModels``), so that one
plan has one price whatever was offered and a search offered more devices never chooses a
plan priced above the best one it would choose on fewer: the replicable schedules' stages
are offered each count of ranks from their stage count to N (up to 8; above, the powers of
two and N: ``rank_ladder``), and a split that leaves some of them idle is left to the offer
of as many ranks as it uses.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from pipecompile.errors import PlanError, ProgramError
from pipecompile.ir.programs.cost_model import CostModel
from pipecompile.ir.programs.program import Program
from pipecompile.ir.programs.recompute_policy import POLICIES
from pipecompile.ir.records.sizes import format_size
from pipecompile.planner.graph_plans import predict_graph
from pipecompile.planner.model_facts import ModelFacts
from pipecompile.planner.plan import Plan, Predicted
from pipecompile.planner.predict import Predictor
from pipecompile.planner.rank_models import RankModels, rank_ladder
from pipecompile.schedules import (
    GRAPHS,
    LOOPED,
    ORDER,
    REPLICABLE,
    SYNCHRONOUS,
    V_SHAPED,
    schedule_of,
)

__all__ = ["ORDER", "Space", "SearchResult", "search", "divisors"]

_TIE = 1e-9  # steps equal to this many seconds rank by their other keys (``_rank``)
_PROGRESS_S = 3.0  # a search running longer says how far it got this often


@dataclass(frozen=True)
class Space:
    """What the search may choose; a fixed option is a one-element tuple."""

    devices: int
    stages: tuple[int, ...] = ()  # () = any count the schedule can place on the devices
    schedules: tuple[str, ...] = tuple(s for s in ORDER if s in SYNCHRONOUS)
    microbatches: tuple[int, ...] = ()  # () = the divisors of the batch
    virtual_stages: tuple[int, ...] = (2, 4)
    recompute: tuple[str, ...] = ()  # () = never, or all three under a memory limit
    ranks: tuple[int, ...] = ()  # () = any count up to ``devices`` (--tune's rebuild: one)
    replicate: bool = True  # False: no stage replicas (a loss over the whole batch)
    # chains, and stage graphs of the schedules that run them (--chain: chains, --graph:
    # graphs only): a plan of one stage a device is priced as either (graph_plans)
    shapes: tuple[str, ...] = ("chain", "graph")


@dataclass(frozen=True)
class _Offer:
    """A plan offered ``ranks`` ranks: the partitioner spreads its stages over ``workers``
    of them as replicas (None: one stage, or its virtual stages, per rank)."""

    plan: Plan
    ranks: int
    workers: int | None


@dataclass(frozen=True)
class SearchResult:
    """The plans that fit, best first, and how many were predicted in all."""

    ranked: tuple[Predicted, ...]
    tried: int  # plans predicted in full
    seconds: float = 0.0
    bounded: int = 0  # plans the bound skipped (see ``search``'s ``keep``)

    @property
    def best(self) -> Predicted:
        return self.ranked[0]


def divisors(n: int) -> tuple[int, ...]:
    return tuple(k for k in range(1, n + 1) if n % k == 0)


def search(
    facts: ModelFacts,
    *,
    batch: int,
    space: Space,
    machine: CostModel | RankModels,
    progress: Callable[[str], None] | None = None,
    keep: int | None = None,
) -> SearchResult:
    """Predict every plan of ``space`` for ``batch`` samples and rank those that fit, each
    with the cost model of its rank count (``machine``: one for every count, or each
    count's). With ``keep`` (the plans a caller shows), a one-stage-per-device plan that
    cannot beat the ``keep``-th best step found so far is bounded out (not under a memory
    limit): when its slowest stage alone takes longer (one probe of the partitioner), or its
    exact split's fill-and-drain bound does (``Predictor.beyond``), before its program is
    generated or simulated. The best ``keep`` plans are the same, found without predicting
    the rest.

    Raises:
        PlanError: no plan of the space exists (too few devices for the requested
            boundaries, no micro-batch count that divides the batch and suits a schedule)
            or none fits the memory limit (naming the smallest peak found).
    """
    start = time.perf_counter()
    _check_space(facts, batch, space)
    models = machine if isinstance(machine, RankModels) else RankModels.same(machine, space.devices)
    predictors: dict[CostModel, Predictor] = {}  # counts of one model share its splits
    atoms: dict[tuple[object, ...], object] = {}  # and models that price ops alike, the atoms

    def predictor(ranks: int) -> Predictor:
        machine = models.at(ranks)
        if machine not in predictors:
            predictors[machine] = Predictor(facts, batch, machine, atoms)
        return predictors[machine]

    fits: list[Predicted] = []
    misfits: list[tuple[_Offer, Program]] = []
    best: list[float] = []  # the best steps so far, at most ``keep``
    tried = bounded = 0
    said = start
    limited = bool(models.at(space.devices).memory_limit)
    floors, order = _ordered(facts, batch, space, models, predictor)
    for offer in order:
        plan, workers = offer.plan, offer.workers
        priced = predictor(offer.ranks)
        graph = _as_graph(offer, priced, space)
        if graph is not None:
            tried += 1
            _fits(graph, fits, best, keep)
        if "chain" not in space.shapes:
            continue
        if _beyond(offer, priced, floors[offer], best[keep - 1 :] if keep else [], limited):
            bounded += 1
            continue
        try:
            program = priced.program(plan)
        except ProgramError:
            continue
        tried += 1
        got = priced.predict(plan, program, workers)
        if got is None:
            misfits.append((offer, program))
        elif got.devices == offer.ranks:  # else: the offer of the ranks it uses prices it
            _fits(got, fits, best, keep)
        if progress is not None and time.perf_counter() - said > _PROGRESS_S:
            said = time.perf_counter()
            progress(f"searching: {tried} plans predicted, {bounded} bounded out so far")
    if not fits:
        _none_fits(tried, _peaks(predictor, misfits), models.at(space.devices), space)
    ranked = sorted(fits, key=_rank)
    if progress is not None:
        progress(
            f"searched {tried + bounded} plans ({bounded} bounded out) in "
            f"{time.perf_counter() - start:.1f} s"
        )
    return SearchResult(tuple(ranked), tried, time.perf_counter() - start, bounded)


def _beyond(
    offer: _Offer, priced: Predictor, floor: float, kth: list[float], limited: bool
) -> bool:
    """Whether ``offer`` cannot beat ``kth``, the ``keep``-th best step so far (if any): its
    floor is above it, or, one stage a device without a memory limit, ``Predictor.beyond``."""
    if not kth:
        return False
    cutoff, plan = kth[0], offer.plan
    if floor > cutoff + _TIE:
        return True
    return (
        plan.schedule in REPLICABLE and not limited and priced.beyond(plan, offer.workers, cutoff)
    )


def _fits(got: Predicted, fits: list[Predicted], best: list[float], keep: int | None) -> None:
    """Keep a plan that fits, and its step among the ``keep`` best so far."""
    fits.append(got)
    if keep:
        bisect.insort(best, got.step)
        del best[keep:]


def _as_graph(offer: _Offer, priced: Predictor, space: Space) -> Predicted | None:
    """The offer's plan as a stage graph, predicted, where the space takes graphs and it has
    one stage a device and no replicas (``graph_plans``)."""
    if "graph" not in space.shapes or offer.workers is not None or offer.plan.replicas:
        return None
    if offer.plan.schedule not in GRAPHS or offer.plan.stages != offer.ranks:
        return None
    return predict_graph(priced, offer.plan)


def _ordered(
    facts: ModelFacts,
    batch: int,
    space: Space,
    models: RankModels,
    predictor: Callable[[int], Predictor],
) -> tuple[dict[_Offer, float], list[_Offer]]:
    """Each offer's floor (a step it cannot beat), and the offers likely best first (the
    kept plans get good sooner, the bounds skip more): by a rough step, or the plan's floor
    where that is higher."""
    offers = list(_offers(facts, batch, space, models.at(space.devices)))
    floors = {o: predictor(o.ranks).floor(o.plan, o.workers) for o in offers}  # each once
    params = sum(facts.params)

    def likely(o: _Offer) -> float:
        micro = predictor(o.ranks).micro_batch_seconds(o.plan)
        return max(_promise(o, micro, models.at(o.ranks), params), floors[o])

    return floors, sorted(offers, key=likely)


def _promise(offer: _Offer, micro: float, machine: CostModel, params: int) -> float:
    """A rough step of ``offer``'s plan in seconds, to try the likely best plans first: the
    sooner the kept plans are good, the more of the rest the bound skips (the plans kept are
    the same in any order). ``micro``: one micro-batch's forward and backward seconds on one
    device (its operators' fixed costs included: many small micro-batches cost more than
    their FLOPs); ``params``: the model's parameter bytes. A stage of s with r replicas is
    priced as one device that runs each of the m micro-batches at its busiest replica's
    share, ceil(m / r) / m of a 1 / s share of a micro-batch's work, and two instructions of
    the runtime's overhead; s - 1 more such slots fill and drain the pipeline; then its
    replicas all-reduce a 1 / s share of the parameters and the optimizer steps it."""
    plan = offer.plan
    stages, m = plan.stages, plan.microbatches
    replicas = max(1, offer.ranks // stages) if offer.workers is not None else 1
    slot = micro / stages * -(-m // replicas) / m + 2 * machine.instr_overhead
    share = params / stages
    after = 2 * (replicas - 1) / replicas * share / machine.bandwidth
    if machine.optimizer_rate:
        after += share / machine.optimizer_rate
    return (m + stages - 1) * slot + after


def _rank(p: Predicted) -> tuple[float, int, int, int]:
    plan = p.plan
    return (
        round(p.step, 9),
        POLICIES.index(plan.recompute),
        plan.microbatches,
        ORDER.index(plan.schedule),
    )


def _offers(facts: ModelFacts, batch: int, space: Space, machine: CostModel) -> Iterator[_Offer]:
    """Every plan of ``space`` with the ranks it is offered (the replicable schedules' stages
    each count of ``rank_ladder`` from their own on, up to one a micro-batch a stage)."""
    counts = space.microbatches or divisors(batch)
    policies = space.recompute or (POLICIES if machine.memory_limit else ("never",))
    n, ladder = space.devices, rank_ladder(space.devices)
    for schedule in space.schedules:
        for stages, v in _shapes(schedule, n, space.virtual_stages):
            if space.stages and stages not in space.stages:
                continue
            if stages > facts.atoms or stages < len(facts.forced) + 1:
                continue
            if stages == 1 and schedule != space.schedules[0]:
                continue  # one stage: every schedule runs the same steps
            held = stages // schedule_of(schedule).stages_a_device(v)
            replicable = schedule in REPLICABLE and space.replicate
            offered = [r for r in ladder if r >= stages] if replicable else [held]
            for ranks in (r for r in offered if not space.ranks or r in space.ranks):
                workers = ranks if ranks != held else None
                for m in counts:
                    if ranks > stages * m:  # a replica beyond the micro-batches would idle
                        continue
                    for policy in policies:
                        yield _Offer(Plan(schedule, stages, m, policy, v), ranks, workers)


def _shapes(
    schedule: str, devices: int, virtual: Sequence[int]
) -> Iterator[tuple[int, int | None]]:
    """The stage counts (and virtual stages) ``schedule`` places on up to ``devices`` devices:
    a plan may use fewer devices than offered, where more would cost more than they save (a
    small model's messages)."""
    if schedule in LOOPED:
        for used in range(min(2, devices), devices + 1):
            for v in virtual:
                yield used * v, v
    elif schedule in V_SHAPED:
        for used in range(min(2, devices), devices + 1):
            yield 2 * used, None
    elif schedule in REPLICABLE:
        for stages in range(1, devices + 1):
            yield stages, None
    else:
        for used in range(1, devices + 1):
            yield used, None


def _placing(schedules: Sequence[str], stages: int, space: Space) -> str:
    """How each family of ``schedules`` places stages on devices, and the counts that fit."""
    devices, said = space.devices, []
    one = [s for s in schedules if s not in LOOPED and s not in V_SHAPED]
    if one:
        more = " or more" if all(s in REPLICABLE for s in one) else ""
        said.append(
            f"{', '.join(one)} {_verb(one, 'run')} one stage per device (give --devices "
            f"{stages}{more})"
        )
    looped = [s for s in schedules if s in LOOPED]
    if looped:
        counts = sorted({s for s, _ in _shapes(looped[0], devices, space.virtual_stages)})
        takes = _listed_counts(counts)
        said.append(
            f"{', '.join(looped)} {_verb(looped, 'put')} --virtual-stages stages on each device, "
            f"so up to {devices} "
            f"devices take {takes} (or give --virtual-stages V with --stages = V x --devices)"
        )
    shaped = [s for s in schedules if s in V_SHAPED]
    if shaped:
        counts = sorted({s for s, _ in _shapes(shaped[0], devices, space.virtual_stages)})
        fix = f" or --devices {stages // 2}" if stages % 2 == 0 and stages > 2 * devices else ""
        said.append(
            f"{', '.join(shaped)} {_verb(shaped, 'put')} two stages on each device (a V), so "
            f"up to {devices} devices "
            f"take --stages {_listed_counts(counts)}{fix}"
        )
    return "; ".join(said)


def _listed_counts(counts: Sequence[int]) -> str:
    """``4, 6 or 8``."""
    text = [str(c) for c in counts]
    return ", ".join(text[:-1]) + " or " + text[-1] if len(text) > 1 else "".join(text)


def _verb(names: Sequence[str], verb: str) -> str:
    return verb + "s" if len(names) == 1 else verb


def check_placing(space: Space) -> None:
    """Raise PlanError when no schedule of ``space`` places its stage count on its devices
    (a V takes two stages a device, a loop its virtual stages)."""
    if space.stages and not any(
        s in space.stages
        for sched in space.schedules
        for s, _ in _shapes(sched, space.devices, space.virtual_stages)
    ):
        stages = space.stages[0]
        why = _placing(space.schedules, stages, space)
        raise PlanError(f"--stages {stages} cannot run on --devices {space.devices}: {why}")


def _check_space(facts: ModelFacts, batch: int, space: Space) -> None:
    if space.devices < 1:
        raise PlanError(f"--devices must be at least 1, got {space.devices}")
    if not space.microbatches and batch < 1:
        raise PlanError("the example batch is empty: give the model's inputs at least one sample")
    bad = [m for m in space.microbatches if batch % m]
    if bad:
        raise PlanError(
            f"--microbatches {bad[0]} does not divide the batch of {batch} samples; choose one "
            f"of {', '.join(map(str, divisors(batch)))} or auto"
        )
    most = max(
        (
            s
            for sched in space.schedules
            for s, _ in _shapes(sched, space.devices, space.virtual_stages)
        ),
        default=0,
    )
    check_placing(space)
    needed = len(facts.forced) + 1
    if needed > most:
        raise PlanError(
            f"--devices {space.devices}: the {needed - 1} requested boundaries (split_point(), "
            f"pipe_split() or --split-at) make {needed} stages, more than "
            f"{', '.join(space.schedules)} can place on {space.devices} devices; give "
            f"--devices {needed} or more, or drop some boundaries"
        )


def _peaks(
    predictor: Callable[[int], Predictor], misfits: list[tuple[_Offer, Program]]
) -> list[tuple[int, Plan]]:
    """Each plan over the memory limit with its largest device peak without the limit (what
    the error names; worked out only when no plan fits)."""
    found = []
    unlimited: dict[int, Predictor] = {}  # per priced predictor, sharing its atoms' figures
    for offer, program in misfits:
        priced = predictor(offer.ranks)
        if id(priced) not in unlimited:
            free = replace(priced.machine, memory_limit=())
            unlimited[id(priced)] = Predictor(priced.facts, priced.batch, free, priced.atoms)
        got = unlimited[id(priced)].predict(offer.plan, program, offer.workers)
        found.append((got, offer.plan))
    return [(max(got.memory) if got is not None else 0, plan) for got, plan in found]


def _none_fits(
    tried: int, misfits: list[tuple[int, Plan]], machine: CostModel, space: Space
) -> None:
    if not tried:
        raise PlanError(
            f"no plan of {', '.join(space.schedules)} on {space.devices} devices suits the "
            f"micro-batch counts {', '.join(map(str, space.microbatches)) or 'tried'}: "
            "a looped schedule needs a multiple of the devices; try --microbatches auto or another "
            "--schedule"
        )
    peak, plan = min(misfits, key=lambda t: t[0])
    limit = ", ".join(format_size(b) for b in machine.memory_limit)
    raise PlanError(
        f"no plan on {space.devices} devices fits --memory-limit {limit}: the smallest peak "
        f"found is {format_size(peak)} ({plan.flags}); raise --memory-limit to "
        f"{format_size(peak)} or more, or use more --devices"
    )
