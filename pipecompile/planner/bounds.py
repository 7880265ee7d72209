"""Lower bounds on a plan's simulated step, for the search to skip plans that cannot beat
the ones it keeps (``Predictor.beyond``, ``Predictor.floor``): each is at or under what
``ir.simulate`` gives, whatever the split, which the search's tests check against every
plan it predicts."""

from __future__ import annotations

from collections.abc import Callable

from pipecompile.ir.programs.simulate import Costs

__all__ = ["fill_and_drain", "least_forwards", "replica_counts", "within"]


def fill_and_drain(costs: Costs, m: int, whole: bool) -> float:
    """A bound the simulated makespan of a one-stage-per-device program of m micro-batches
    on ``costs`` never undercuts, each stage's F_i, its backward B_i (``whole``: one
    instruction) or I_i and W_i (B_i / 2 + the split's extra each; the zero-bubble schedules
    split every one)
    and o a compute instruction's overhead. Some stage j

    - starts after micro-batch 0's forwards before it, runs its m forwards and backwards:
      sum(F_i + o, i < j) + m (F_j + backward_j);
    - or runs its m backwards after the first gradient reached it, micro-batch 0's
      forwards through every stage and its gradient's way back to j: sum(F_i + o) +
      sum(I_i + o, i > j) + m backward_j;

    and with whole backwards the last micro-batch's backwards before j follow either:
    + sum(B_i + o, i < j)."""
    o, n = costs.overhead, len(costs.forward)
    extra = costs.split_extra or (0.0,) * n
    back = [b + o if whole else b + 2 * x + 2 * o for b, x in zip(costs.backward, extra)]
    inward = [b + o if whole else b / 2 + x + o for b, x in zip(costs.backward, extra)]
    forwards = sum(costs.forward) + n * o
    after = [0.0] * n  # the gradient's way from the last stage back to stage j
    for j in range(n - 2, -1, -1):
        after[j] = after[j + 1] + inward[j + 1]
    before = drain = bound = 0.0
    for j, f in enumerate(costs.forward):
        busy = m * back[j]
        bound = max(bound, before + m * (f + o) + busy + drain, forwards + after[j] + busy + drain)
        before += f + o
        drain += inward[j] if whole else 0.0
    return bound


def replica_counts(stages: int, workers: int, microbatches: int) -> list[int]:
    """The replica counts of ``stages`` stages over ``workers`` that make a stage's work
    cheapest per unit of the forward path: as many replicas on the first stages as the
    micro-batches let them use, one on the rest (most first)."""
    extra, out = workers - stages, []
    for _ in range(stages):
        r = min(microbatches, 1 + extra)
        extra -= r - 1
        out.append(r)
    return out


def least_forwards(total: float, bottleneck: float, counts: list[int]) -> float:
    """The least sum over stages of w_j / r_j (a micro-batch's way through replicated
    stages: a stage's simulated cost is its work over at most its replica count), for
    works w_j that add up to ``total`` and stay within ``bottleneck`` x r_j each (a part's
    time is at least its work over its replicas), the replica counts ``counts`` (from
    ``replica_counts``, whose concentration is the cheapest) filled most first; infinite
    where ``total`` does not fit under the bottleneck."""
    left, out = total, 0.0
    for r in counts:
        take = min(left, bottleneck * r)
        out += take / r
        left -= take
        if left <= 0:
            return out
    return float("inf")


def within(
    convex: Callable[[int], float], lo: int, hi: int, limit: float
) -> tuple[int, int] | None:
    """The integers x in [lo, hi] with ``convex(x) <= limit`` (an interval, ``convex`` being
    convex), as (least, most); None when there are none. Three bisections: its lowest
    point, then either side's crossing of ``limit``."""
    bottom = _least_true(lo, hi, lambda x: x == hi or convex(x + 1) >= convex(x))
    if convex(bottom) > limit:
        return None
    least = _least_true(lo, bottom, lambda x: convex(x) <= limit)
    most = _least_true(bottom, hi, lambda x: x == hi or convex(x + 1) > limit)
    return least, most


def _least_true(lo: int, hi: int, holds: Callable[[int], bool]) -> int:
    """The least x in [lo, hi] where ``holds`` (false, then true from some x on; true at
    ``hi``)."""
    while lo < hi:
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo
