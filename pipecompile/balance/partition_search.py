"""Exact min-max partition under a stage-time model with communication, memory and replication.

Items 0..n-1 are cut into ``parts`` contiguous, non-empty parts; part j spans [a, b). Its
time, in integer units, is

    time_j(a, b) = (work_j[b] - work_j[a] + cut[a] + cut[b]) * ceil(m / r_j) / m
                   + sync[r_j] * (param[b] - param[a]) / (r_j * m)

where ``work_j`` is a prefix sum of item costs already scaled by part j's device speed,
``cut[k]`` the communication cost of a boundary before item k (charged to both parts
beside it), ``r_j`` the part's replica count, m the step's micro-batches and ``sync[r]``
the per-unit cost of one all-reduce of the part's parameters among r replicas (spread over
the step's micro-batches). The r replicas share the m micro-batches, at most ceil(m / r) each:
a replica beyond the m-th has none, and 3 replicas of 4 micro-batches finish no sooner than 2,
so a replica is only chosen where it shortens the busiest one's share (r never exceeds m).
Part j must also satisfy every memory constraint ``mem[b] - mem[a] + at_start[a] <= limit``
given for it, and no part may contain a forced boundary strictly inside.

``solve`` finds the least integer bound B with ``time_j <= B`` for every part (so B is the
exact optimum rounded up to one unit) by binary search on B (after a guess and its
neighbour, where the caller has a guess); a probe decides feasibility
exactly with a sweep over parts: after j parts, each position with the fewest workers that
reach it (more are dominated), and for each part the ends every start reaches (those b in
(a, last_end(a)] whose threshold is at most a's key). Without a memory limit that is, per
replica count, one running maximum over an array with a row per workers count (or, split
into a few chains along which the fewest workers never fall, per chain one running maximum
and a binary search on it: the earliest start that reaches an end has the chain's fewest
workers); with one,
a vectorised "interval maximum" per pair. Cost per probe: O(parts · W · R · n) array work
for W distinct worker counts and R replica choices (O(parts · n) without replication).

Without memory limits, a met probe's band narrows the probes under its bound: the fewest
workers with which the later parts can finish from each position (a probe of the mirrored
problem, ``_needs``) drop every position no split under that bound goes through, and each
layer's ends are looked for only where they could still finish. Near the optimum the band
holds a few percent of the positions or less. The search starts under the least bottleneck
of a few splits of about even load (``_even_bound``), often within a few percent of the
optimum, which also answers ``fits_under`` without a probe where it is under the bound.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "Limit",
    "Problem",
    "Solution",
    "solve",
    "fits_under",
    "forget",
    "part_times",
    "interval_max",
]

_NEG = np.iinfo(np.int64).min // 4
_FAR = np.iinfo(np.int64).max // 4  # workers used to reach a position no split reaches
MONOTONE_PATH = True  # ``_monotone_layer`` where it applies (tests also check without it)
BANDS = True  # probes within a met bound's band (``_banded_probe``; tests also check without)
_CHAINS = 4  # monotone chains a layer may split into before the rows are cheaper


@dataclass(frozen=True)
class Limit:
    """A memory constraint on one part: ``mem[b] - mem[a] + at_start[a] <= limit``, with
    ``mem`` a non-decreasing prefix array and ``at_start`` the bytes that depend on where the
    part starts (e.g. its stored inputs); both of length n + 1."""

    mem: np.ndarray
    at_start: np.ndarray
    limit: int


@dataclass(frozen=True)
class Problem:
    """A partition problem (see the module docstring); arrays have length n + 1."""

    work: tuple[np.ndarray, ...]  # per part: prefix sums of scaled item costs
    cut: np.ndarray  # per boundary: communication cost, charged to both neighbours
    limits: tuple[tuple[Limit, ...], ...] = ()  # per part: its memory constraints
    forced: tuple[int, ...] = ()  # boundaries a part must start at
    workers: int | None = None  # replication: total ranks to spread over the parts
    param: np.ndarray | None = None  # prefix sums of parameter sync costs (with workers)
    microbatches: int = 1
    # the bound-free arrays every probe of this problem reuses (``_stacked``, ``_choices``,
    # the last ends), kept from a caller's ``fits_under`` to its ``solve``; ``solve`` and
    # ``forget`` empty it
    cache: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def parts(self) -> int:
        return len(self.work)

    @property
    def items(self) -> int:
        return len(self.cut) - 1


@dataclass(frozen=True)
class Solution:
    starts: tuple[int, ...]
    replicas: tuple[int, ...]
    bottleneck: int
    times: tuple[int, ...] = field(default=())


def solve(
    problem: Problem,
    within: int | None = None,
    guess: int | None = None,
    least: int | None = None,
) -> Solution | None:
    """The split with the least bottleneck, or None when no split meets the memory limits.
    ``within``: a bound some split is known to meet, and ``least`` one under which none is
    (a caller's probes), which narrow the search; ``guess``: a bottleneck the optimum is
    likely near (a similar problem's), from which the search gallops before it bisects. The
    result is the same."""
    n, p = problem.items, problem.parts
    if not 1 <= p <= n:
        raise ValueError(f"cannot split {n} items into {p} non-empty parts")
    if problem.workers is not None and problem.workers < p:
        raise ValueError(f"{problem.workers} workers cannot hold {p} parts")
    bases = problem.cache
    last_end = _last_ends(problem)
    seen: dict[int, list | None] = {}

    def probe(bound: int) -> list | None:  # each bound once: the last met one is walked back
        if bound not in seen:
            seen[bound] = _banded_probe(problem, last_end, bound)
        return seen[bound]

    known = [b for b in (within, _even_bound(problem)) if b is not None]
    met = min(known, default=None)  # a bound some split meets, if one is known
    hi = _upper_bound(problem) if met is None else met
    if met is None and probe(hi) is None:
        return None
    lo = max(_lower_bound(problem), least or 0)
    if guess is not None and lo <= guess < hi:
        lo, hi = _gallop(probe, lo, hi, guess)
    # until a probe has met a bound (and made a band), probe just under a known one: an even
    # load's split is often within a few percent of the optimum, and a band made that close
    # is narrow
    banding = met is not None and not any(problem.limits)
    while lo < hi:
        mid = (lo + hi) // 2
        if banding and "met" not in problem.cache:
            mid = max(mid, hi - max(1, hi >> 6))
        if probe(mid) is None:
            lo = mid + 1
        else:
            hi = mid
    reach = probe(lo)
    assert reach is not None
    starts, replicas = _walk_back(problem, last_end, lo, reach, bases)
    forget(problem)  # the caller keeps the solution
    times = part_times(problem, starts, replicas)
    return Solution(starts, replicas, max(times), times)


def forget(problem: Problem) -> None:
    """Drop what probes of ``problem`` kept (a caller done with it)."""
    problem.cache.clear()


def _gallop(probe: Callable[[int], list | None], lo: int, hi: int, guess: int) -> tuple[int, int]:
    """Narrow [lo, hi] (the optimum inside, hi met) by probing ``guess`` and its neighbour
    toward the optimum: two probes settle a guess that is exact or one off, and leave the
    bisection at most one probe more than it had without a guess."""
    if probe(guess) is not None:
        if guess == lo or probe(guess - 1) is None:
            return guess, guess
        return lo, guess - 1
    if guess + 1 >= hi or probe(guess + 1) is not None:
        return guess + 1, guess + 1
    return guess + 2, hi


def part_times(
    problem: Problem, starts: Sequence[int], replicas: Sequence[int] | None = None
) -> tuple[int, ...]:
    """Each part's time (rounded up to a unit) for the split that starts parts at ``starts``."""
    n, m = problem.items, problem.microbatches
    ends = [*starts[1:], n]
    rs = replicas or (1,) * len(starts)
    out = []
    for j, (a, b, r) in enumerate(zip(starts, ends, rs)):
        work = int(problem.work[j][b] - problem.work[j][a] + problem.cut[a] + problem.cut[b])
        total = _slots(m, r) * work
        total += _sync(problem, r, a, b)
        out.append(-(-total // (r * m)))
    return tuple(out)


def _slots(m: int, r: int) -> int:
    """The micro-batch slots of r replicas sharing m micro-batches: r times the most any of them
    runs, ceil(m / r); m itself when r divides m."""
    return r * -(-m // r)


def _sync(problem: Problem, r: int, a: int, b: int) -> int:
    if problem.param is None or r == 1:
        return 0
    return 2 * (r - 1) * int(problem.param[b] - problem.param[a])


def _upper_bound(problem: Problem) -> int:
    """A bound every split meets: everything on one part, at its slowest speed."""
    total = max(int(w[-1]) for w in problem.work) + 2 * int(problem.cut.max(initial=0))
    if problem.param is not None and problem.workers:
        total += 2 * problem.workers * int(problem.param[-1])
    return total


def _even_bound(problem: Problem) -> int | None:
    """The least bottleneck of a few splits of about even load, which some split meets: equal
    work with the workers spread evenly (at most m replicas a part), and work in proportion
    to each part's capacity with the replica counts of the most capacity (``_spread``), the
    most replicated parts first or last. None under memory limits or forced cuts (they may
    break them), or where every such split leaves a part empty. The probes only offer the
    replica counts that shorten a part's busiest replica's share, and the least of those
    that run as many micro-batches as r does is no slower, so a split the probe sees meets
    it too."""
    p, m = problem.parts, problem.microbatches
    if problem.forced or any(problem.limits):
        return None
    if "even" not in problem.cache:  # kept from a caller's ``fits_under`` to its ``solve``
        if problem.workers is None:
            found = [_balanced(problem, [1.0] * p, None)]
        else:
            each, left = divmod(problem.workers, p)
            spread = [min(each + (j < left), m) for j in range(p)]
            found = [_balanced(problem, [1.0] * p, spread)]
            for counts in (most := _spread(p, problem.workers, m), most[::-1]):
                shares = [_capacity(m, r) for r in counts]
                found.append(_balanced(problem, shares, list(counts)))
        problem.cache["even"] = min((b for b in found if b is not None), default=None)
    return problem.cache["even"]


def _balanced(problem: Problem, shares: list[float], replicas: list[int] | None) -> int | None:
    """The bottleneck of the split whose parts' work is in proportion to ``shares`` (None
    where that leaves a part empty)."""
    n, work = problem.items, problem.work[0]
    ends = np.cumsum(shares)[:-1] / sum(shares)
    starts = [0, *np.searchsorted(work, work[-1] * ends, side="left").tolist()]
    if any(b <= a for a, b in zip(starts, starts[1:])) or starts[-1] >= n:
        return None
    return max(part_times(problem, starts, replicas))


@functools.lru_cache(maxsize=1024)
def _spread(parts: int, workers: int, m: int) -> tuple[int, ...]:
    """Replica counts of ``parts`` parts over at most ``workers`` workers with the most
    capacity, m / ceil(m / r) micro-batches' work a part, and of those the most even (the
    least sum of squares: a part's all-reduce grows with its replicas), most first: the
    least r of each busiest share, as the probes offer them."""
    options = _offered(m, workers)
    # per part count and workers used: the best (capacity, - sum of squares), and the
    # replica count of the last part on the way to it
    best: list[dict[int, tuple[float, int]]] = [{0: (0.0, 0)}]
    came: list[dict[int, int]] = [{}]
    for _ in range(parts):
        score: dict[int, tuple[float, int]] = {}
        last: dict[int, int] = {}
        for used, (capacity, squares) in best[-1].items():
            for r in options:
                got = (capacity + _capacity(m, r), squares - r * r)
                if used + r <= workers and (used + r not in score or got > score[used + r]):
                    score[used + r], last[used + r] = got, r
        best.append(score)
        came.append(last)
    used = max(best[-1], key=lambda u: (best[-1][u], -u))
    counts = []
    for k in range(parts, 0, -1):
        counts.append(came[k][used])
        used -= counts[-1]
    return tuple(sorted(counts, reverse=True))


def _lower_bound(problem: Problem) -> int:
    """A bound no split beats: the whole work at the fastest part's speed spread over every
    worker (a part's time is at least its work over its replicas)."""
    fastest = min(int(w[-1]) for w in problem.work)
    return max(0, fastest // (problem.workers or problem.parts) - 1)


def _last_end(problem: Problem, j: int) -> np.ndarray:
    """Per start a, the last end b a part j starting at a may have (memory, forced cuts)."""
    n = problem.items
    starts = np.arange(n + 1)
    end = np.full(n + 1, n, dtype=np.int64)
    if problem.forced:
        cuts = np.array(sorted(problem.forced), dtype=np.int64)
        nxt = np.searchsorted(cuts, starts, side="right")
        end = np.where(nxt < len(cuts), cuts[np.minimum(nxt, len(cuts) - 1)], n)
    for limit in problem.limits[j] if problem.limits else ():
        room = limit.limit + limit.mem - limit.at_start
        end = np.minimum(end, np.searchsorted(limit.mem, room, side="right") - 1)
    return end


def _choices(problem: Problem, j: int, used: int, bases: dict) -> Sequence[int]:
    """Part j's replica counts when ``used`` workers hold the parts before it (kept in
    ``bases``)."""
    if problem.workers is None:
        return range(1, 2)
    most = _most(problem, j, used)
    if ("choices", most) not in bases:
        bases["choices", most] = _offered(problem.microbatches, most)
    return bases["choices", most]


def _offered(m: int, most: int) -> list[int]:
    """The replica counts up to ``most`` a part of m micro-batches may have: a replica past
    the m-th would idle, and r replicas whose busiest runs no fewer micro-batches than r - 1
    would only add an all-reduce share, so the least r of each busiest share."""
    return [r for r in range(1, min(most, m) + 1) if r == 1 or -(-m // (r - 1)) > -(-m // r)]


def _capacity(m: int, r: int) -> float:
    """Micro-batches' work r replicas of a part take in the time one runs m: m / ceil(m / r)."""
    return m / -(-m // r)


def _most(problem: Problem, j: int, used: int) -> int:
    """The most replicas part j may have (with replication) when ``used`` workers hold the
    parts before it: one worker is left for each part after it, and a replica past the m-th
    micro-batch would idle (``_monotone_layer``'s ``room`` is the same limit on the workers
    used, read once per layer)."""
    assert problem.workers is not None
    return min(problem.workers - used - (problem.parts - 1 - j), problem.microbatches)


def _step(
    problem: Problem, j: int, r: int, reach: np.ndarray, bound: int, bases: dict
) -> tuple[np.ndarray, np.ndarray]:
    """Key of every usable start and the threshold of every end for part j with r replicas:
    the part [a, b) fits under ``bound`` iff key[a] >= threshold[b] (and a < b <= last_end[a]).
    ``bases`` keeps each (j, r)'s arrays without the bound, which every probe reuses."""
    key, threshold = _base(problem, j, r, bases)
    return np.where(reach, key, _NEG), threshold - r * problem.microbatches * bound


def _base(problem: Problem, j: int, r: int, bases: dict) -> tuple[np.ndarray, np.ndarray]:
    """Part j's key and bound-free threshold with r replicas (a row of ``_stacked``)."""
    keys, thresholds = _stacked(problem, j, r, bases)
    return keys[r], thresholds[r]


def fits_under(problem: Problem, bound: int) -> bool:
    """Whether some split has every part's time within ``bound`` (one probe of ``solve``'s
    search, or none where a split of even load meets it: a caller that only needs to know
    the optimum is above a bound stops there)."""
    if bound < _lower_bound(problem):
        return False
    even = _even_bound(problem)
    if even is not None and even <= bound:  # a split meets it
        return True
    return _banded_probe(problem, _last_ends(problem), bound, narrow=False) is not None


def _banded_probe(
    problem: Problem, last_end: list[np.ndarray], bound: int, narrow: bool = True
) -> list | None:
    """``_probe`` within the band of the least met bound probed so far at or above ``bound``
    (kept in ``problem.cache``). A met probe leaves its layers for the probes under it; with
    ``narrow`` (a bisection, whose next probes are all under it) its band is made from them
    (``_needs``, about a probe's work where the band is wide, little where it is narrow)."""
    cache = problem.cache
    met = cache.get("met")  # the least met bound probed, its layers and its band if made
    if BANDS and narrow and met is not None and met[0] >= bound and met[2] is None:
        met = cache["met"] = met[0], met[1], _needs(problem, met[0], met[1])
    need = met[2] if BANDS and met is not None and met[0] >= bound else None
    layers = _probe(problem, last_end, bound, cache, need)
    if layers is not None and not any(problem.limits) and (met is None or bound < met[0]):
        # a band made within 1/256 of this bound is about as narrow as this one's would be
        if met is None or met[2] is None or met[0] - bound > bound >> 8:
            cache["met"] = bound, layers, None
    return layers


def _last_ends(problem: Problem) -> list[np.ndarray]:
    if "last_end" not in problem.cache:
        problem.cache["last_end"] = [_last_end(problem, j) for j in range(problem.parts)]
    return problem.cache["last_end"]


def _probe(
    problem: Problem,
    last_end: list[np.ndarray],
    bound: int,
    bases: dict,
    need: list[np.ndarray] | None = None,
) -> list | None:
    """If a split under ``bound`` exists, per number of parts the fewest workers with which
    each position is reachable (``_FAR`` where it is not). ``need``: per number of parts, the
    fewest workers with which the parts after them can cover the rest from each position
    under some bound at or above ``bound`` (``_needs``); a position they cannot finish from
    within the workers is dropped as soon as it is reached. The positions on a path that
    finishes keep their fewest, so the result is the same, and a bound no split meets fails
    at the layer where the reached positions and the finishing ones stop meeting."""
    n, p = problem.items, problem.parts
    fewest = np.full(n + 1, _FAR, dtype=np.int64)
    fewest[0] = 0
    layers = [fewest]
    total = problem.workers if problem.workers is not None else p
    free = _segments(problem)  # without a memory limit a part may end anywhere before a cut
    for j in range(p):
        if not (problem.limits and problem.limits[j]):  # every (used, replicas) at once
            window = (0, n) if need is None else _window(need[j + 1], fewest, total)
            fewest = _layer_reachable(problem, j, fewest, bound, bases, free, window)
        else:
            nxt: dict[int, np.ndarray] = {}
            for used, reach in _masks(fewest).items():
                for r in _choices(problem, j, used, bases):
                    key, threshold = _step(problem, j, r, reach, bound, bases)
                    got = _reachable(key, threshold, last_end[j])
                    nxt[used + r] = nxt[used + r] | got if used + r in nxt else got
            fewest = _fewest(nxt, n)
        if need is not None:
            fewest = np.where(fewest + need[j + 1] <= total, fewest, _FAR)
        if fewest.min() == _FAR:
            return None
        layers.append(fewest)
    return layers if fewest[n] < _FAR else None


def _window(need: np.ndarray, fewest: np.ndarray, total: int) -> tuple[int, int]:
    """The first and last end a part after ``fewest`` may reach and still be finished from
    (``need``) within ``total`` workers, each part taking one at least ((n, 0): none)."""
    finishing = np.flatnonzero(need <= total - 1 - fewest.min())
    return (int(finishing[0]), int(finishing[-1])) if len(finishing) else (len(need) - 1, 0)


def _needs(problem: Problem, bound: int, layers: list[np.ndarray]) -> list[np.ndarray]:
    """Per number of parts j, the fewest workers with which the last p - j parts cover the
    items from each position on under ``bound`` (``_FAR`` where they cannot): a probe of the
    mirrored problem, within the positions ``layers`` (a met probe's) reached. A probe under a
    lower bound reaches fewer positions, each with no fewer workers, and finishes from fewer,
    with no fewer: what it drops by them (``_probe``'s ``need``) is on no split it meets."""
    p = problem.parts
    mirrored = _mirrored(problem)
    reached = [layer[::-1] for layer in reversed(layers)]  # per mirrored part count
    found = _probe(mirrored, _last_ends(mirrored), bound, mirrored.cache, reached)
    assert found is not None, "a met probe's mirror is met"
    return [found[p - j][::-1] for j in range(p + 1)]


def _mirrored(problem: Problem) -> Problem:
    """The problem read from its last item to its first (kept in ``problem.cache``): its part
    j is the original's part p - 1 - j over the mirrored positions n - b .. n - a."""
    if "mirrored" not in problem.cache:
        n = problem.items
        problem.cache["mirrored"] = Problem(
            work=tuple(w[-1] - w[::-1] for w in reversed(problem.work)),
            cut=problem.cut[::-1].copy(),
            forced=tuple(n - f for f in problem.forced),
            workers=problem.workers,
            param=None if problem.param is None else problem.param[-1] - problem.param[::-1],
            microbatches=problem.microbatches,
        )
    return problem.cache["mirrored"]


def _fewest(layer: dict[int, np.ndarray], n: int) -> np.ndarray:
    """Each position under the fewest workers that reach it: a continuation from it with
    more workers used is also open with fewer (a part's replica choices only shrink as
    workers are used), so the rest are dominated. A position's predecessor on a path of
    fewest workers is itself reached with its fewest, so ``_walk_back`` still finds it."""
    out = np.full(n + 1, _FAR, dtype=np.int64)
    for used in sorted(layer, reverse=True):
        out[layer[used]] = used
    return out


def _masks(fewest: np.ndarray) -> dict[int, np.ndarray]:
    """The positions of each workers count of a layer, fewest first."""
    return {int(u): fewest == u for u in np.unique(fewest[fewest < _FAR])}


def _layer_reachable(
    problem: Problem,
    j: int,
    fewest: np.ndarray,
    bound: int,
    bases: dict,
    segments: list[tuple[int, int]],
    window: tuple[int, int],
) -> np.ndarray:
    """The ends part j reaches under ``bound``, each with the fewest workers used after it,
    from the starts of ``fewest`` (workers used before it), where every start a of a
    segment [s, e) may end anywhere in (a, e] (no memory limit): per replica count, one row
    per workers count that may choose it, all in one array (the keys and thresholds are the
    replica count's, shared by its rows). The best key over the starts before each end is a
    running maximum (linear, no sparse table); the first row that reaches an end has the
    fewest workers. ``window``: the first and last end worth finding (``_window``; the
    monotone path looks no further, the rows' ends outside it are dropped after)."""
    reached = fewest < _FAR
    out = np.full_like(fewest, _FAR)
    if not reached.any():
        return out
    chains = _chains(fewest, reached) if MONOTONE_PATH else None
    if chains is not None:  # the fewest used have the most choices: every other's among them
        counts = list(_choices(problem, j, int(fewest[reached].min()), bases))
        if not counts:
            return out
        chosen = _chosen(problem, j, counts, bases)
        return _monotone_layer(problem, j, fewest, chains, bound, counts, chosen, segments, window)
    useds = np.unique(fewest[reached])
    choices = {int(u): set(_choices(problem, j, int(u), bases)) for u in useds}
    counts = sorted(set().union(*choices.values()))
    if not counts:
        return out
    keys, thresholds = _stacked(problem, j, counts[-1], bases)
    masks = fewest[None, :] == useds[:, None]  # a row per workers count, fewest first
    for r in counts:  # per replica count, the workers counts that may choose it at once
        rows = np.array([r in choices[int(u)] for u in useds])
        key2 = np.where(masks[rows], keys[r], _NEG)
        best = np.full(key2.shape, _NEG, dtype=np.int64)
        for s, e in segments:
            best[:, s + 1 : e + 1] = np.maximum.accumulate(key2[:, s:e], axis=1)
        hit = best >= thresholds[r] - r * problem.microbatches * bound
        first = useds[rows][hit.argmax(axis=0)] + r  # the fewest used that reach each end
        np.minimum(out, np.where(hit.any(axis=0), first, _FAR), out=out)
    return out


def _chains(fewest: np.ndarray, reached: np.ndarray) -> list[np.ndarray] | None:
    """The reached positions as a few chains along which the fewest workers never fall
    (each chain: the positions at or above the highest count before them among those
    left), or None where that takes more than ``_CHAINS`` (the rows are then cheaper)."""
    left, out = reached.copy(), []
    while left.any():
        if len(out) == _CHAINS:
            return None
        highest = np.maximum.accumulate(np.where(left, fewest, -1))
        chain = left & (highest == fewest)
        out.append(chain)
        left &= ~chain
    return out


def _monotone_layer(
    problem: Problem,
    j: int,
    fewest: np.ndarray,
    chains: list[np.ndarray],
    bound: int,
    counts: Sequence[int],
    chosen: tuple[np.ndarray, np.ndarray, np.ndarray],
    segments: list[tuple[int, int]],
    window: tuple[int, int],
) -> np.ndarray:
    """``_layer_reachable`` over ``chains`` of positions along which the fewest workers never
    fall (``_chains``; most layers are one chain: more atoms covered take more workers):
    along a chain the earliest start that reaches an end has the fewest workers of the
    chain's that do, and it is where the running maximum of the chain's keys first meets
    the end's threshold (a binary search on that non-decreasing maximum, over the chain's
    starts alone). One row per (chain, replica count), not one per (workers count, replica
    count); each chain's ends only from its first start to the farthest end its greatest
    key could meet (``_chosen``'s least thresholds from each end on: a second chain of a
    few starts looks at a few ends)."""
    keys, thresholds, least = chosen
    out = np.full_like(fewest, _FAR)
    counts_ = np.asarray(counts, dtype=np.int64)
    rs = counts_[:, None]
    # r replicas are open after u workers while u + r leaves a worker for each later part
    # (r <= m holds for every count)
    room = _FAR - 1 if problem.workers is None else problem.workers - (problem.parts - 1 - j)
    lowered = rs * (problem.microbatches * bound)
    for chain in chains:
        at = np.flatnonzero(chain)
        for s, e in segments:
            lo, hi = np.searchsorted(at, (s, e))
            if lo == hi:
                continue
            starts = at[lo:hi]
            highest = np.maximum.accumulate(keys[:, starts], axis=1)
            # no end past the last whose least threshold from it on some row's greatest key
            # meets, none at or before the first start
            first_end = max(int(starts[0]) + 1, window[0])
            met = least[:, first_end : min(e, window[1]) + 1] <= highest[:, -1:] + lowered
            last_end = first_end + int(met.sum(axis=1).max()) - 1
            if last_end < first_end:
                continue
            wanted = thresholds[:, first_end : last_end + 1] - lowered
            first = np.empty(wanted.shape, dtype=np.int64)
            for row, (most, needed) in enumerate(zip(highest, wanted)):
                first[row] = np.searchsorted(most, needed)  # len(starts): none meets it
            start = starts[np.minimum(first, len(starts) - 1)]
            used = fewest[start] + rs
            ends = np.arange(first_end, last_end + 1)
            ok = (first < len(starts)) & (start < ends) & (used <= room)
            got = np.where(ok, used, _FAR).min(axis=0)
            span = out[first_end : last_end + 1]
            np.minimum(span, got, out=span)
    return out


def _chosen(
    problem: Problem, j: int, counts: Sequence[int], bases: dict
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Part j's keys, bound-free thresholds and least thresholds from each end on (the
    minimum over the ends after it) for the replica counts ``counts``, a row each, made once
    per distinct work array and kept in ``bases``."""
    kind, counts = _kind(problem, j, bases), tuple(counts)
    if ("chosen", kind, counts) not in bases:
        keys, thresholds = _stacked(problem, j, counts[-1], bases)
        rows = np.asarray(counts, dtype=np.int64)
        picked = thresholds[rows]
        least = np.minimum.accumulate(picked[:, ::-1], axis=1)[:, ::-1].copy()
        bases["chosen", kind, counts] = keys[rows], picked, least
    return bases["chosen", kind, counts]


def _stacked(problem: Problem, j: int, most: int, bases: dict) -> tuple[np.ndarray, np.ndarray]:
    """Part j's keys and bound-free thresholds for 0..``most`` replicas as two arrays (row r:
    r replicas; row 0 unused, as 1), made once per distinct work array (parts on equally
    fast devices share theirs) and kept in ``bases``; at least the replicas part j may
    ever have are made at once."""
    work = problem.work[j]
    kind = _kind(problem, j, bases)
    have = bases.get(("stacked", kind))
    if have is None or len(have[0]) <= most:
        top = max(most, min(problem.microbatches, problem.workers or 1))
        r = np.maximum(np.arange(top + 1, dtype=np.int64), 1)[:, None]
        slots = r * -(-problem.microbatches // r)
        keys = slots * (work - problem.cut)[None, :]
        thresholds = slots * (work + problem.cut)[None, :]
        if problem.param is not None:
            sync = 2 * (r - 1) * problem.param[None, :]
            keys, thresholds = keys + sync, thresholds + sync
        have = keys, thresholds
        bases["stacked", kind] = have
    return have


def _kind(problem: Problem, j: int, bases: dict) -> int:
    """The first part whose work array equals part j's."""
    if "kinds" not in bases:
        firsts: list[int] = []  # the first part of each distinct work array
        kinds = []
        for i, w in enumerate(problem.work):
            kind = next((k for k in firsts if np.array_equal(problem.work[k], w)), None)
            if kind is None:
                firsts.append(kind := i)
            kinds.append(kind)
        bases["kinds"] = kinds
    return bases["kinds"][j]


def _segments(problem: Problem) -> list[tuple[int, int]]:
    """The runs of starts [s, e) between forced cuts: a part starting in one ends by e."""
    bounds = [0, *sorted(f for f in problem.forced if 0 < f < problem.items), problem.items]
    return [(s, e) for s, e in zip(bounds, bounds[1:]) if s < e]


def _reachable(key: np.ndarray, threshold: np.ndarray, last_end: np.ndarray) -> np.ndarray:
    usable = np.flatnonzero((key > _NEG) & (last_end > np.arange(len(key))))
    if len(usable) == 0:
        return np.zeros(len(key), dtype=bool)
    best = interval_max(usable + 1, last_end[usable], key[usable], len(key))
    return best >= threshold


def interval_max(lo: np.ndarray, hi: np.ndarray, value: np.ndarray, size: int) -> np.ndarray:
    """``out[b]`` = the largest ``value[i]`` with ``lo[i] <= b <= hi[i]`` (a very negative
    number where none covers b). Each interval is written as two overlapping power-of-two
    blocks of a sparse table, which is then pushed down level by level."""
    length = hi - lo + 1
    level = np.floor(np.log2(length)).astype(np.int64)
    top = int(level.max())
    table = np.full((top + 1, size), _NEG, dtype=np.int64)
    np.maximum.at(table, (level, lo), value)
    np.maximum.at(table, (level, hi - (1 << level) + 1), value)
    for k in range(top, 0, -1):
        half = 1 << (k - 1)
        np.maximum(table[k - 1], table[k], out=table[k - 1])
        np.maximum(table[k - 1][half:], table[k][: size - half], out=table[k - 1][half:])
    return table[0]


def _walk_back(
    problem: Problem, last_end: list[np.ndarray], bound: int, layers: list, bases: dict
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Recover one split under ``bound`` from the reachable sets, last part first."""
    n, p = problem.items, problem.parts
    end = n
    used = int(layers[p][end])
    starts: list[int] = []
    replicas: list[int] = []
    for j in range(p - 1, -1, -1):
        for before, reach in _masks(layers[j]).items():
            r = used - before
            if r not in _choices(problem, j, before, bases):
                continue
            key, threshold = _step(problem, j, r, reach, bound, bases)
            ok = (key >= threshold[end]) & (np.arange(n + 1) < end) & (last_end[j] >= end)
            hits = np.flatnonzero(ok)
            if len(hits):
                starts.append(int(hits[0]))
                replicas.append(r)
                end, used = int(hits[0]), before
                break
        else:
            raise AssertionError("reachable sets do not lead back to the start")
    return tuple(reversed(starts)), tuple(reversed(replicas))
