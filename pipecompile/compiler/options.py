"""The options of `pipecompile compile`, declared once (``CompileOptions``) for the command
line's flags and ``pipecompile.compile``'s keywords (``api``: the keyword's name there; the
machine's options are the API's one ``machine=CostModel(...)``).

One ``CompileOptions`` is built from the command line (``from_args``) or from the API's
keywords (``from_keywords``) and handed whole to the compiler, the plan search's ``--tune``
and the emitter; what a field's text means (``--pin-cost``, ``--replicate``, the machine's
flags) is read by its method here, once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipecompile.balance.split_requests import parse_pins
from pipecompile.compiler.pass_names import PASSES
from pipecompile.errors import PipecompileError
from pipecompile.ir.programs.cost_model import CostModel, parse_limits, parse_rate, parse_speeds
from pipecompile.ir.programs.recompute_policy import chosen_policy
from pipecompile.ir.records.batch_coupling import Coupling
from pipecompile.options.fields import (
    count_or_auto,
    declared,
    nonnegative_int,
    option,
    positive_int,
    size,
)
from pipecompile.options.run import BACKENDS
from pipecompile.passes.balance_stages import COSTS
from pipecompile.passes.insert_recompute import POLICIES
from pipecompile.passes.insert_replication import parse_replicas
from pipecompile.schedules import DEFAULT_SCHEDULE, SCHEDULES

__all__ = ["CompileOptions"]


@dataclass
class CompileOptions:
    """What `pipecompile compile` was asked for; None: not given (refusals tell it apart)."""

    stages: int | None = option(
        "--stages",
        check=positive_int,
        help="number of pipeline stages (or --devices: the plan search chooses)",
    )
    devices: int | None = option(
        "--devices",
        check=positive_int,
        metavar="N",
        help="search the plans that use N devices (stages, replicas, micro-batches, schedule, "
        "recomputation) and compile the fastest predicted; the options given fix their part",
    )
    output: str | None = option(
        "-o",
        "--output",
        api="directory",
        help="output directory (default: pipecompile-out/<model>)",
    )
    tune: int | None = option(
        "--tune",
        check=positive_int,
        metavar="K",
        api=None,
        help="with --devices: train the K best plans for a few steps here (on their ranks), "
        "print predicted against measured, and emit the measured best",
    )
    microbatches: int | str | None = option(
        "--microbatches",
        check=count_or_auto,
        metavar="M|auto",
        help="micro-batches per mini-batch (default 1: no pipelining, one stage works at a "
        "time; with --devices: searched); auto: the plan search chooses",
    )
    schedule: str | None = option(
        "--schedule",
        choices=[*sorted(SCHEDULES), "auto"],
        help="the order of the micro-batches' forwards and backwards (docs/schedules/; default "
        f"{DEFAULT_SCHEDULE}, with --devices: searched); auto: the plan search chooses",
    )
    balance: str = option(
        "--balance", default="flops", choices=COSTS, help="the cost the stages are balanced on"
    )
    split_at: list[str] | Mapping[str, Any] = option(
        "--split-at",
        repeat=True,
        metavar="[before:|after:]PATH",
        help="start a stage at this submodule (repeatable)",
    )
    pin_cost: list[str] | Mapping[str, int] = option(
        "--pin-cost",
        repeat=True,
        metavar="PATH=COST",
        api="pinned",
        help="count submodule PATH as COST when balancing (repeatable)",
    )
    virtual_stages: int | None = option(
        "--virtual-stages",
        check=positive_int,
        metavar="V",
        help="the looped schedules: stages per device (default 2)",
    )
    chain: bool = option(
        "--chain",
        switch=True,
        help="cut the model into a chain of stages even where branches side by side (towers, "
        "encoders) would run faster on devices of their own (a stage graph)",
    )
    graph: bool = option(
        "--graph",
        switch=True,
        help="put the model's branches side by side on devices of their own (a stage graph) "
        "even where the chain is priced faster",
    )
    vertical_sync: bool = option(
        "--vertical-sync",
        switch=True,
        help="PipeDream: all stages use stage 0's weight version",
    )
    recompute: str = option(
        "--recompute",
        "--checkpoint",
        default="never",
        choices=POLICIES,
        metavar="POLICY",
        help="which micro-batches' forwards are recomputed in backward: "
        f"{', '.join(POLICIES)} (--checkpoint: its old name)",
    )
    replicate: str | tuple[int, ...] | None = option(
        "--replicate",
        metavar="R0,R1,...",
        api="replicas",
        help="ranks per stage, e.g. 2,1,1 (then --nproc their sum)",
    )
    dynamic: str | Mapping[str, Any] | list[str] | None = option(
        "--dynamic",
        metavar="DIMS",
        help="batch,seq: dimensions batches may vary in, traced as symbols (batch: dim 0 of "
        "every input, which varies without the flag unless the model fixes it; seq: dim 1 of "
        "every 2-dim input; the model file's dynamic_shapes() names any others and is merged "
        "with the flag); none: every size as traced",
    )
    memory_budget: int | None = option(
        "--memory-budget",
        check=size,
        metavar="SIZE",
        help="activation bytes per device (e.g. 2GiB); the least recomputation that fits is chosen",
    )
    bandwidth: str = option(
        "--bandwidth",
        default="10GB/s",
        metavar="RATE",
        api="machine",
        help="link speed between devices the balancer assumes (default 10GB/s)",
    )
    flops_rate: float = option(
        "--flops-rate",
        check=float,
        default=1e12,
        metavar="FLOP/S",
        api="machine",
        help="--balance flops: a device's sustained FLOP/s (default 1e12)",
    )
    device_speed: str | None = option(
        "--device-speed",
        metavar="S0,S1,...",
        api="machine",
        help="relative speed per device, e.g. 1,1,0.5,0.5 (default all 1)",
    )
    memory_limit: str | None = option(
        "--memory-limit",
        metavar="SIZE[,SIZE...]",
        api="machine",
        help="bytes per device for parameters, gradients, "
        "optimizer state and activations (e.g. 16GiB); the split "
        "must fit",
    )
    optimizer_states: int = option(
        "--optimizer-states",
        check=int,
        default=2,
        metavar="K",
        api="machine",
        help="parameter-sized tensors the optimizer keeps (AdamW 2, SGD 0)",
    )
    workers: int | None = option(
        "--workers",
        check=int,
        metavar="W",
        api="machine",
        help="ranks to run on: the balancer also chooses how many "
        "replicas each stage gets (then run --nproc W)",
    )
    print_after: list[str] = option(
        "--print-after",
        repeat=True,
        metavar="PASS",
        help=f"print the IR after a pass ({', '.join(PASSES)})",
    )
    verify_each: bool = option(
        "--verify-each",
        switch=True,
        help="run the expensive IR checks (graph re-propagation, program verification and "
        "simulation) after every compiler pass, not only after the last",
    )
    no_verify: bool = option(
        "--no-verify",
        switch=True,
        help="skip the proof at the end of the compile, which runs every emitted stage on the "
        "example micro-batch (forward and backward) against the eager model and the traced graph",
    )
    compile_stages: str | None = option(
        "--compile",
        const="inductor",
        choices=BACKENDS,
        metavar="BACKEND",
        help="runs of this directory put each stage's forward through torch.compile with "
        "BACKEND (default inductor; also aot_eager, eager) unless `run --compile off`",
    )
    onnx: bool = option("--onnx", switch=True, help="also export every stage to stage_<j>.onnx")
    generate: bool = option(
        "--generate",
        switch=True,
        help="a causal language model: also plan its decoding (a KV cache per stage, prefill "
        "and decode programs) for `pipecompile generate OUT`",
    )
    max_length: int | None = option(
        "--max-length",
        check=positive_int,
        metavar="L",
        help="--generate: the longest sequence (prompt and new tokens) the KV cache holds "
        "(default: the positions the model embeds, at most 2048)",
    )
    lanes: int | None = option(
        "--lanes",
        check=positive_int,
        metavar="K",
        help="--generate: groups of sequences in flight, each with a KV cache slot of its "
        "own on every stage (default: the number of stages, so no stage idles)",
    )
    lane_rows: int | None = option(
        "--lane-rows",
        check=positive_int,
        metavar="R",
        help="--generate: sequences per lane, decoded together (default 1)",
    )
    force: bool = option(
        "--force",
        switch=True,
        help="write into an -o directory that holds files pipecompile did not "
        "write (they are kept)",
    )
    weights: str | None = option(
        "--weights",
        metavar="PATH",
        help="pretrained weights the stages load by original name: a "
        ".safetensors file or a Hugging Face directory (sharded, with "
        "model.safetensors.index.json)",
    )
    allow_missing: bool = option(
        "--allow-missing",
        switch=True,
        help="--weights: initialise the model's tensors the --weights files "
        "lacks (listed) instead of refusing it",
    )
    init_seed: int | None = option(
        "--init-seed",
        check=nonnegative_int,
        help="seed of the initialisation of a model built on the meta device (default 0)",
    )
    quiet: bool = option(
        "-q", "--quiet", switch=True, api="progress", help="print nothing but errors"
    )
    # not a flag: the API's ``machine=CostModel(...)``, or the machine flags' (``cost_model``)
    machine: CostModel | None = dataclasses.field(default=None, metadata={})
    # not a flag: --tune compiling a plan the search priced on this many ranks
    ranks: int | None = dataclasses.field(default=None, metadata={})
    # not a flag: the model file's loss_fn mixes the samples of its batch (found by the
    # compile command from loss_fn and example_targets): a loss over the whole batch
    loss_coupling: Coupling | None = dataclasses.field(default=None, metadata={})

    @classmethod
    def from_keywords(cls, **keywords: Any) -> CompileOptions:
        """The options of ``pipecompile.compile``'s keywords (each field's ``api`` name;
        ``progress`` the opposite of ``quiet``, ``checkpoint`` the old name of ``recompute``).

        Raises:
            PipecompileError: a keyword no field declares, or recompute and checkpoint that
                disagree.
        """
        flags = declared(cls)
        names = {o.api or f.name: f.name for f, o in flags if o.api not in (None, "machine")}
        names["machine"] = "machine"  # the machine flags' one keyword
        recompute = chosen_policy(
            keywords.pop("recompute", "never"), keywords.pop("checkpoint", None)
        )
        unknown = sorted(set(keywords) - set(names))
        if unknown:
            raise PipecompileError(
                f"compile() got unknown option(s) {', '.join(unknown)}; it takes "
                f"{', '.join(sorted({*names, 'recompute', 'checkpoint'}))}"
            )
        values = {names[k]: v for k, v in keywords.items()}
        if "quiet" in values:
            values["quiet"] = not values["quiet"]
        else:
            values["quiet"] = True  # the API prints nothing unless asked
        for name in ("split_at", "print_after"):
            if isinstance(values.get(name), (tuple, frozenset, set)):
                values[name] = list(values[name])
        return cls(recompute=recompute, **values)

    def cost_model(self) -> CostModel:
        """What the balancer and the plan search assume about the devices: the API's
        ``machine``, else the machine flags' values."""
        if self.machine is not None:
            return self.machine
        return CostModel(
            bandwidth=parse_rate(self.bandwidth, "--bandwidth"),
            flops_rate=self.flops_rate,
            device_speed=parse_speeds(self.device_speed) if self.device_speed else (),
            memory_limit=parse_limits(self.memory_limit) if self.memory_limit else (),
            optimizer_states=self.optimizer_states,
            workers=self.workers,
        )

    def pinned(self) -> dict[str, int] | None:
        """``--pin-cost``'s module path -> cost (None: none pinned)."""
        if isinstance(self.pin_cost, Mapping):
            return dict(self.pin_cost) or None
        return parse_pins(self.pin_cost) or None

    def replicas(self, stages: int | None) -> tuple[int, ...] | None:
        """``--replicate``'s ranks per stage (None: not given), checked against ``stages``
        when that is known."""
        if self.replicate is None or not isinstance(self.replicate, str):
            return tuple(self.replicate) if self.replicate is not None else None
        if stages is None:  # the plan search refuses fixed replicas with its own message
            return tuple(int(t) for t in self.replicate.split(",") if t.strip().isdigit())
        return parse_replicas(self.replicate, stages)
