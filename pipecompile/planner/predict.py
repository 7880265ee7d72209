"""Predict one plan: its exact split under the cost model, its simulated step and its peak
memory per device.

The split is the partitioner's own (``partition_search.solve`` on ``build_problem``): the
least slowest-stage time, compute plus communication at the plan's micro-batch size, over
the replicas the plan may use, under the memory limits when every device runs one stage.
With several stages per device the limits are checked on the unconstrained optimum. The
step is the simulated makespan of the plan's program with each stage's forward at a third of
its time (the backward two thirds, as the partitioner counts them), a replicated stage's
micro-batches shared among its replicas (r replicas of a stage with m micro-batches each run
ceil(m / r) of them, so a replica with none to run saves nothing; the partitioner counts the
same shares), the runtime's overhead per instruction, and the replicas' gradient
all-reduce and every device's optimizer step after the last backward. Ranks that share a
machine's cores (the model's ``concurrency``) take at least their summed work (every
replica's) over that concurrency.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from pipecompile.balance.partition_problem import AtomFacts, StageShape, build_problem
from pipecompile.balance.partition_search import Problem, Solution, fits_under, forget, solve
from pipecompile.ir.programs.cost_model import CostModel, scaled_speeds
from pipecompile.ir.programs.memory_model import device_peak_bytes, peak_weight_copies
from pipecompile.ir.programs.program import Program
from pipecompile.ir.programs.recompute_policy import policy_counts, with_recompute
from pipecompile.ir.programs.simulate import Costs, Timeline, simulate
from pipecompile.ir.programs.topology import Topology
from pipecompile.planner.bounds import fill_and_drain, least_forwards, replica_counts, within
from pipecompile.planner.model_facts import ModelFacts
from pipecompile.planner.plan import Plan, Predicted
from pipecompile.schedules import compute_program, schedule_of

__all__ = ["Predictor"]

_FS = 1e15  # the partition problem's time unit is femtoseconds (times its ``unit``)
_US = 10**9  # the search's splits are exact to the microsecond


@dataclass
class Predictor:
    """Predicts plans for one model, batch and machine; remembers the splits it solved."""

    facts: ModelFacts
    batch: int
    machine: CostModel
    # the atoms' figures per size, shared by the predictors of one search whose models price
    # ops alike (rank counts differ in their messages and cores, not in an op's seconds)
    atoms: dict[tuple[object, ...], object] = field(default_factory=dict, repr=False)
    # (micro-batch size, devices) -> the graph split of the model there, or None, and
    # "blocks": its parallel blocks (graph_plans)
    graph_splits: dict[object, object] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._splits: dict[tuple[object, ...], Solution | None] = {}
        self._least: dict[int, tuple[float, float | None]] = {}  # per size: ``_least_work``'s
        self._problems: dict[tuple[object, ...], tuple[Problem, float]] = {}
        self._unmet: dict[tuple[object, ...], int] = {}  # the highest cutoff no split meets
        # per (size, micro-batches, workers): each stage count's split's bottleneck; the
        # nearest stage count's is often equal or near to another's (the search gallops
        # from it)
        self._near: dict[tuple[object, ...], dict[int, int]] = {}

    def program(self, plan: Plan) -> Program:
        """The plan's compute program with its recomputed forwards marked."""
        compute = compute_program(
            plan.schedule, plan.stages, plan.microbatches, virtual_stages=plan.virtual_stages
        )
        return with_recompute(compute, policy_counts(plan.recompute, compute))

    def predict(self, plan: Plan, program: Program, workers: int | None) -> Predicted | None:
        """``plan`` predicted; None if no split of it fits the memory limits. ``workers``:
        devices the partitioner spreads the stages over (choosing replicas), or None."""
        size = self.batch // plan.microbatches
        facts = self._facts_at(size)
        free = replace(self.machine, memory_limit=(), workers=workers)
        found = self._split(size, free, program)
        if found is None:
            return None
        memory = _memory(facts, self.machine, program, found.starts)
        replicated = workers is not None and any(r > 1 for r in found.replicas)
        limits = device_limits(self.machine, found.replicas if replicated else ())
        over = any(
            (limit := limits(d)) is not None and memory[d] > limit for d in range(len(memory))
        )
        if over and len(program.devices) == program.num_stages and not replicated:
            found = self._split(size, replace(self.machine, workers=workers), program)
            if found is None:
                return None
            memory = _memory(facts, self.machine, program, found.starts)
        elif over:
            return None
        replicas = found.replicas if workers is not None else ()
        plan = replace(plan, replicas=tuple(replicas) if any(r > 1 for r in replicas) else ())
        step, bubble = self._step(facts, free, program, found)
        return Predicted(plan, step, bubble, memory, found.starts)

    def beyond(self, plan: Plan, workers: int | None, step: float) -> bool:
        """Whether ``plan`` (one stage per device, no memory limit) cannot reach ``step``
        seconds, by two bounds the simulated step never undercuts; a search keeping its best
        plans then neither generates nor simulates its program.

        1. Its slowest stage's m micro-batches alone (with its replicas' share and all-reduce,
           as the split prices them) and their instructions' overhead take longer, or its
           m backwards (two thirds of it) after micro-batch 0's forwards through every stage
           (a third of the least work, over the most replicas a stage can have, and S
           instructions' overhead) do: one probe of the partitioner at the lower of the
           two bottlenecks these allow.
        2. Split exactly, its fill-and-drain bound (``bounds.fill_and_drain``) and then the
           split's own optimizer step and largest all-reduce, which the step adds after the
           drain.

        Before the split the optimizer step after the drain adds at least its share
        (``_optimizer_floor``).
        """
        if plan.graph:  # the bounds are a chain's: a stage graph may run its branches at once
            return False
        size = self.batch // plan.microbatches
        shape = _Shape(plan.stages, tuple(range(plan.stages)), plan.microbatches)
        free = replace(self.machine, memory_limit=(), workers=workers)
        key = self._key(size, free, shape)
        problem, unit = self._problem(size, free, shape)
        m, o = plan.microbatches, self.machine.instr_overhead
        record = schedule_of(plan.schedule)  # whole backwards, one stage a device: F and B
        whole = record.placement == "one" and not record.split_backward
        k = 2 if whole else 3
        target = step
        step -= self._optimizer_floor(plan.stages)
        # a bottleneck B (rounded up to a unit) makes the step at least m (B - 1) units, and
        # its stage's m k instructions each cost o more
        seconds = unit / _FS
        cutoff = int((step - m * k * o) / (m * seconds)) + 1
        window = self._window(plan, workers, seconds, k, step, cutoff)
        if window is None:
            return True
        least, cutoff = window
        found = self._splits.get(key)
        if found is None:  # not solved yet: one probe, unless a higher cutoff failed one
            if cutoff <= self._unmet.get(key, -1) or not fits_under(problem, cutoff):
                self._unmet[key] = max(cutoff, self._unmet.get(key, -1))
                forget(problem)
                return True
            if least > 1 and fits_under(problem, least - 1):
                forget(problem)
                return True
            known = least if least > 1 else None  # no split under least - 1, probed
            found = self._split(size, free, shape, cutoff, known)  # type: ignore[arg-type]
            assert found is not None  # no memory limit, and a split fits under the cutoff
        elif not least <= found.bottleneck <= cutoff:
            return True
        # split: the split's own optimizer step and all-reduce after the drain
        facts = self._facts_at(size)
        after = self._optimizer(facts, shape.stage_device, found, free) + _sync(facts, found, free)
        return fill_and_drain(self.stage_costs(size, free, shape, found), m, whole) + after > target

    def _window(
        self, plan: Plan, workers: int | None, seconds: float, k: int, step: float, most: int
    ) -> tuple[int, int] | None:
        """The bottlenecks (in units of ``seconds``, at most ``most``) with which ``plan``
        could still simulate a step within ``step``, as [least, most]; None if none could.
        A bottleneck B's stage runs its m backwards (2/3 m (B - 1) units and (k - 1) m
        instructions' overhead, or as much in replica all-reduce) after micro-batch 0's
        forwards through every stage (S instructions and a third of the least work, each
        stage's over its replicas, no stage's over B: ``bounds.least_forwards``). That is
        convex in B: the forwards shrink as B lets more work onto the replicated stages,
        the backwards grow. With whole backwards (k = 2) every stage's backward of one
        micro-batch is on that path too (``bounds.fill_and_drain``: the last micro-batch's
        backwards before B's stage and the first gradient's way to it), so the whole least
        work is, with 2S + m - 1 instructions' overhead and B's stage's m - 1 backwards
        more. With split backwards (k = 3) the first stage's path bounds it too: micro-batch
        0's forwards through every stage and its gradient's inputs back to the first (a third
        of each later stage's work), at least two thirds of the least work and 2S - 1
        instructions; with many stages of few replicas that path is the longer."""
        m, s, o = plan.microbatches, plan.stages, self.machine.instr_overhead
        total = self._least_work(self.batch // m, s)
        counts = replica_counts(s, workers, m) if workers is not None else [1] * s

        def least_step(b: int) -> float:
            if k == 2:
                path = (2 * s + m - 1) * o + least_forwards(total, b * seconds, counts)
                return path + 2 / 3 * (m - 1) * (b - 1) * seconds
            least = least_forwards(total, b * seconds, counts)
            busiest = s * o + least / 3 + 2 / 3 * m * (b - 1) * seconds + m * (k - 1) * o
            return max(busiest, (2 * s - 1) * o + 2 / 3 * least)

        first = max(1, math.ceil(total / (seconds * sum(counts))))  # the least work fits
        if first > most:
            return None
        window = within(least_step, first, most, step)
        if window is None:
            return None
        least, highest = window
        return (least if least > first else 1), highest  # below first no split fits

    def floor(self, plan: Plan, workers: int | None) -> float:
        """Seconds under which no split of ``plan`` simulates a step (``predict`` never
        undercuts it), from the model's total work alone: no split, no program. With T one
        micro-batch's forward and backward over every stage (the atoms' work on the fastest
        device, plus a message each way over each of the S - 1 boundaries at their cheapest),
        m micro-batches, P devices of the program and o the runtime's overhead per
        instruction:

        - one micro-batch's forwards then backwards run one after another: 2T / 3 (the
          forward and a split backward's I) + 2 S o; with replicas each stage's share of it
          is at least T_j / r_j, r_j <= min(m, D - S + 1) for D workers;
        - the busiest device runs at least its share of every instruction: (m T + 2 m S o) /
          P, or m T / D + 2 m o over D workers (sum r_j <= D);
        - ranks that share cores: (m T + 2 m S o) over their concurrency;
        - then the optimizer step of the largest device: every parameter's over P."""
        m, s = plan.microbatches, plan.stages
        total = self._least_work(self.batch // m, s)
        o = self.machine.instr_overhead
        per = schedule_of(plan.schedule).stages_a_device(plan.virtual_stages)
        held = max(1, s // per)
        if workers is None:
            path = 2 * total / 3 + 2 * s * o
            load = (m * total + 2 * m * s * o) / held
        else:
            path = 2 * total / 3 / min(m, workers - s + 1) + 2 * s * o
            load = m * total / workers + 2 * m * o
        step = max(path, load)
        if self.machine.concurrency:
            step = max(step, (m * total + 2 * m * s * o) / self.machine.concurrency)
        return step + self._optimizer_floor(held)

    def _optimizer_floor(self, devices: int) -> float:
        """The least optimizer step after the drain over ``devices`` devices: the largest
        device's share of every parameter."""
        if not self.machine.optimizer_rate:
            return 0.0
        return sum(self.facts.params) / self.machine.optimizer_rate / devices

    def micro_batch_seconds(self, plan: Plan) -> float:
        """One micro-batch's forward and backward seconds under ``plan`` at the least (every
        atom on the fastest device; ``_least_work``)."""
        return self._least_work(self.batch // plan.microbatches, plan.stages)

    def _least_work(self, size: int, stages: int) -> float:
        """One micro-batch of ``size`` samples' forward and backward seconds over ``stages``
        stages at the least: every atom on the fastest device, each boundary's messages at
        the cheapest boundary's. A split's stage works are floored to the problem's unit (a
        microsecond): 2 units a stage less is the margin."""
        if size not in self._least:  # the work of every atom, the cheapest boundary's
            facts = self._facts_at(size)
            speeds = scaled_speeds(self.machine, range(max(1, len(self.machine.device_speed))))
            comm = (facts.forward + facts.backward)[1:-1]
            cut = None
            if len(comm):
                cut = float(comm.min()) / self.machine.bandwidth + self.machine.message_latency
            self._least[size] = sum(facts.cost) * min(speeds) / _FS, cut
        total, cut = self._least[size]
        work = total - 2 * stages * _US / _FS
        if stages < 2 or cut is None:
            return work
        return work + 2 * (stages - 1) * cut

    def atoms_at(self, size: int) -> AtomFacts:
        """The model's atoms at micro-batches of ``size`` samples (``_facts_at``)."""
        return self._facts_at(size)

    def walk_at(self, size: int) -> list[float]:
        """``ModelFacts.walk_seconds`` at ``size`` samples (``_walk_at``)."""
        return self._walk_at(size)

    def _facts_at(self, size: int) -> AtomFacts:
        """The model's atoms at micro-batches of ``size`` samples, gathered once per size
        (and ops' prices: ``atoms``)."""
        key = ("facts", size, _op_prices(self.machine))
        if key not in self.atoms:
            self.atoms[key] = self.facts.at(size, self.machine)
        return self.atoms[key]  # type: ignore[return-value]

    def _walk_at(self, size: int) -> list[float]:
        """``ModelFacts.walk_seconds`` at ``size`` samples, once per size and ops' prices."""
        key = ("walk", size, _op_prices(self.machine))
        if key not in self.atoms:
            self.atoms[key] = self.facts.walk_seconds(size, self.machine)
        return self.atoms[key]  # type: ignore[return-value]

    def _split(
        self,
        size: int,
        machine: CostModel,
        program: Program,
        within: int | None = None,
        least: int | None = None,
    ) -> Solution | None:
        """The exact split of ``program``'s stages at micro-batches of ``size`` samples (the
        memory limits, when ``model`` has some, depend on the whole program). ``within``: a
        bound some split meets; ``least``: one under which none does."""
        key = self._key(size, machine, program)
        if key not in self._splits:
            found = None
            if program.num_stages <= len(self._facts_at(size).cost):
                near = self._near.setdefault((size, program.microbatches, machine.workers), {})
                stages = program.num_stages
                closest = min(near, key=lambda s: (abs(s - stages), s), default=None)
                guess = None if closest is None else near[closest]
                problem = self._problem(size, machine, program)[0]
                found = solve(problem, within, guess, least)
                if found is not None:
                    near[stages] = found.bottleneck
            self._splits[key] = found
        return self._splits[key]

    def _key(self, size: int, machine: CostModel, program: Program | StageShape) -> tuple:
        """What a split depends on (the memory limits, when ``model`` has some, depend on
        the whole program)."""
        speeds = tuple(machine.speed(d) for d in program.stage_device)
        limited = program if machine.memory_limit else None
        return (size, speeds, program.microbatches, machine.workers, limited)

    def _problem(
        self, size: int, machine: CostModel, shape: Program | StageShape
    ) -> tuple[Problem, float]:
        """The partition problem of a split (and its unit), built once for every schedule,
        probe, split and stage-cost reading that shares it."""
        key = self._key(size, machine, shape)
        if key not in self._problems:
            self._problems[key] = build_problem(
                self._facts_at(size),
                kind="flops",
                machine=machine,
                program=shape,
                forced=self.facts.forced,
                resolution=_US,
            )
        return self._problems[key]

    def stage_costs(
        self, size: int, machine: CostModel, shape: Program | StageShape, found: Solution
    ) -> Costs:
        """Each stage's forward, backward and extra seconds per micro-batch of ``size``
        samples under the split ``found`` (a replicated stage's at its busiest replica's
        share)."""
        problem, unit = self._problem(size, machine, shape)
        ends = [*found.starts[1:], problem.items]
        seconds = unit / _FS
        walk = self._walk_at(size)
        forward, backward, extra = [], [], []
        for j, (a, b) in enumerate(zip(found.starts, ends)):
            r = found.replicas[j] if machine.workers is not None else 1
            share = -(-shape.microbatches // r) / shape.microbatches  # per replica
            work = problem.work[j][b] - problem.work[j][a] + problem.cut[a] + problem.cut[b]
            forward.append(work * seconds / 3 * share)
            backward.append(2 * work * seconds / 3 * share)
            extra.append(sum(walk[a:b]) * share)  # half of the backward's non-matmul work
        return Costs(tuple(forward), tuple(backward), self.machine.instr_overhead, tuple(extra))

    def _step(
        self, facts: AtomFacts, machine: CostModel, program: Program, found: Solution
    ) -> tuple[float, float]:
        costs = self.stage_costs(self.batch // program.microbatches, machine, program, found)
        timeline = simulate(program, Topology.chain(program.num_stages), costs)
        sync = _sync(facts, found, machine)
        step = timeline.makespan
        if self.machine.concurrency:  # ranks share cores: no faster than their work over them
            replicas = found.replicas if machine.workers is not None else ()
            busy = [min(r, program.microbatches) for r in replicas]  # a replica may idle
            work = sum(timeline.busy(d) * (busy[d] if busy else 1) for d in range(timeline.devices))
            step = max(step, work / self.machine.concurrency)
        step += self._optimizer(facts, program.stage_device, found, machine)
        replicas = found.replicas if machine.workers is not None else ()
        return float(step + sync), _bubble(timeline, program.microbatches, replicas)

    def _optimizer(
        self,
        facts: AtomFacts,
        stage_device: Sequence[int],
        found: Solution,
        machine: CostModel,
    ) -> float:
        """Seconds of the optimizer step after the drain: the largest device's, or every
        rank's over the cores' concurrency where they share them."""
        if not self.machine.optimizer_rate:
            return 0.0
        ends = [*found.starts[1:], len(facts.cost)]
        replicas = found.replicas if machine.workers is not None else (1,) * len(ends)
        per_device = [0.0] * (max(stage_device) + 1)
        for j, (a, b) in enumerate(zip(found.starts, ends)):
            per_device[stage_device[j]] += sum(facts.params[a:b])
        seconds = [nbytes / self.machine.optimizer_rate for nbytes in per_device]
        if not self.machine.concurrency:
            return max(seconds)
        ranks = [r for r in replicas] if len(replicas) == len(seconds) else [1] * len(seconds)
        return max(
            max(seconds), sum(s * r for s, r in zip(seconds, ranks)) / self.machine.concurrency
        )


def _op_prices(machine: CostModel) -> tuple[float, ...]:
    """What an op's seconds depend on (``CostModel.op_seconds``)."""
    rates = (machine.flops_rate, machine.elementwise_rate, machine.conv_rate)
    fixed = (machine.half_work, machine.op_overhead, machine.conv_half_work)
    return (*rates, *fixed, machine.work_scale, machine.fixed_scale)


def _sync(facts: AtomFacts, found: Solution, machine: CostModel) -> float:
    """Seconds of the largest replicated stage's gradient all-reduce after the drain (none
    without replication)."""
    if machine.workers is None:
        return 0.0
    ends = [*found.starts[1:], len(facts.cost)]
    return max(
        (
            2 * (r - 1) / r * sum(facts.params[a:b]) / machine.bandwidth
            for r, a, b in zip(found.replicas, found.starts, ends)
        ),
        default=0.0,
    )


@dataclass(frozen=True)
class _Shape:
    """A one-stage-per-device plan's shape, as ``build_problem`` reads a program."""

    num_stages: int
    stage_device: tuple[int, ...]
    microbatches: int


def _bubble(timeline: Timeline, microbatches: int, replicas: Sequence[int]) -> float:
    """The idle fraction of every device the plan uses over the simulated step: a replicated
    stage's device in the timeline runs its busiest replica's ceil(m / r) micro-batches, the
    others fewer (the runtime gives replica k the micro-batches i with i mod r == k)."""
    if not replicas or all(r == 1 for r in replicas) or timeline.makespan <= 0:
        return float(timeline.bubble_fraction)
    work = 0.0
    for d, r in enumerate(replicas):  # one stage per device where stages are replicated
        work += timeline.busy(d) * microbatches / -(-microbatches // r)
    return float(1.0 - work / (sum(replicas) * timeline.makespan))


def device_limits(machine: CostModel, replicas: Sequence[int]) -> Callable[[int], int | None]:
    """The memory limit of each device of a program whose device ``d`` runs on ``replicas[d]``
    ranks (ranks numbered device by device): the smallest of its ranks' ``--memory-limit``,
    as every replica holds the whole stage."""
    if not replicas:
        return machine.limit
    bases = [sum(replicas[:d]) for d in range(len(replicas))]

    def limit(d: int) -> int | None:
        ranks = range(bases[d], bases[d] + replicas[d])
        found = [machine.limit(k) for k in ranks]
        return None if None in found else min(x for x in found if x is not None)

    return limit


def _memory(
    facts: AtomFacts, machine: CostModel, program: Program, starts: tuple[int, ...]
) -> tuple[int, ...]:
    """Per device, its stages' parameter copies plus its peak of stored activations."""
    ends = [*starts[1:], len(facts.cost)]
    params = [sum(facts.params[a:b]) for a, b in zip(starts, ends)]
    inputs = [int(facts.forward[a]) for a in starts]
    saved = [sum(facts.saved[a:b]) + inputs[j] for j, (a, b) in enumerate(zip(starts, ends))]
    out = []
    for d, instrs in enumerate(program.devices):
        copies = 2 + machine.optimizer_states + peak_weight_copies(instrs)
        mine = [j for j, dev in enumerate(program.stage_device) if dev == d]
        out.append(copies * sum(params[j] for j in mine) + device_peak_bytes(instrs, saved, inputs))
    return tuple(out)
