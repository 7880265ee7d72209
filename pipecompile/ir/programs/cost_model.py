"""What the balancer assumes about the machines: link bandwidth, compute rate, device speeds,
memory per device, optimizer state, and how many workers replication may use."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

from pipecompile.errors import BalanceError
from pipecompile.ir.records.sizes import parse_size

__all__ = ["CostModel", "CostModelJson", "parse_rate", "parse_speeds", "parse_limits"]

DEFAULT_BANDWIDTH = 10e9  # bytes/s: a 100 Gb/s network or a PCIe link between devices
DEFAULT_FLOPS_RATE = 1e12  # FLOP/s a device sustains, for --balance flops


class CostModelJson(TypedDict, total=False):
    """A ``CostModel``'s fields as the manifest records them (the balance's ``model``, the
    plan's ``cost_model``, which adds the calibration it read and the model's key; an
    earlier manifest lacks the later fields)."""

    bandwidth: float
    flops_rate: float | None  # None: unlimited
    device_speed: Sequence[float]  # a list read back, a tuple as the balancer made it
    memory_limit: Sequence[int]
    optimizer_states: int
    workers: int | None
    op_overhead: float
    half_work: float
    instr_overhead: float
    elementwise_rate: float
    concurrency: float
    message_latency: float
    optimizer_rate: float
    conv_rate: float
    conv_half_work: float
    fixed_scale: float
    work_scale: float
    calibration: str | None
    model_key: str


@dataclass(frozen=True)
class CostModel:
    """The balancer's machine model (see docs/PARTITIONING.md).

    Attributes:
        bandwidth: bytes per second between two devices; a boundary's forward activations
            and backward gradients cost bytes / bandwidth on both stages beside it.
        flops_rate: FLOP/s of a device of speed 1, turning ``--balance flops`` into time
            (a forward plus backward costs three times the forward FLOPs).
        device_speed: per device, its speed relative to the others (2 = twice as fast);
            empty means all equal.
        memory_limit: per device (one value: every device), the bytes a stage's
            parameters, gradients, optimizer state, weight copies and stored activations
            may take; empty means no limit.
        optimizer_states: parameter-sized tensors the optimizer keeps (AdamW 2, SGD with
            momentum 1, plain SGD 0).
        workers: ranks to spread over the stages with replication; None: one per stage.
        op_overhead: seconds every op costs beyond its FLOPs (dispatch, launch), forward;
            its backward counts twice that. Calibrated per machine (``pipecompile.planner``).
        half_work: FLOPs at which a contraction runs at half the sustained rate: one of f
            FLOPs takes (f + half_work) / flops_rate, so small micro-batches run less
            efficiently.
        instr_overhead: seconds the runtime spends on one compute instruction besides the
            ops it runs (the plan search's simulated step counts it).
        elementwise_rate: elements per second an elementwise op writes (0: ``flops_rate``,
            counting one FLOP per element).
        concurrency: how many devices can compute at full speed at once (0: all): ranks
            sharing one machine's cores, whose step is at least their summed work over it.
        message_latency: seconds one message between stages costs beyond its bytes over
            ``bandwidth``, waited for once by its receiver (the plan search; calibrated with
            N ranks).
        optimizer_rate: parameter bytes per second the optimizer steps (0: free); the
            plan search adds each device's step after the pipeline drains.
        conv_rate, conv_half_work: ``flops_rate`` and ``half_work`` for convolutions, which
            run at their own efficiency (0: the contractions' figures). Calibrated.
        fixed_scale, work_scale: what the model's own eager timing (the plan search's
            probe, ``planner.model_probe``) multiplies the ops' fixed seconds (their
            overhead and half work) and their work's seconds by: 1 where not probed.
    """

    bandwidth: float = DEFAULT_BANDWIDTH
    flops_rate: float = DEFAULT_FLOPS_RATE
    device_speed: tuple[float, ...] = ()
    memory_limit: tuple[int, ...] = ()
    optimizer_states: int = 2
    workers: int | None = None
    op_overhead: float = 0.0
    half_work: float = 0.0
    instr_overhead: float = 0.0
    elementwise_rate: float = 0.0
    concurrency: float = 0.0
    message_latency: float = 0.0
    optimizer_rate: float = 0.0
    conv_rate: float = 0.0
    conv_half_work: float = 0.0
    fixed_scale: float = 1.0
    work_scale: float = 1.0

    def op_seconds(
        self,
        matmul: float,
        other: float,
        ops: int,
        matmuls: int,
        conv: float = 0.0,
        convs: int = 0,
    ) -> float:
        """Forward plus backward seconds (three forwards' worth) of ``ops`` ops: ``matmuls``
        contractions doing ``matmul`` forward FLOPs in all, ``convs`` convolutions doing
        ``conv``, the others writing ``other`` elements."""
        rate = self.elementwise_rate or self.flops_rate
        work = matmul / self.flops_rate + other / rate
        fixed = self.half_work * matmuls / self.flops_rate + self.op_overhead * ops
        if convs:
            conv_rate = self.conv_rate or self.flops_rate
            half = self.conv_half_work if self.conv_rate else self.half_work
            work += conv / conv_rate
            fixed += half * convs / conv_rate
        return 3 * (work * self.work_scale + fixed * self.fixed_scale)

    def validate(self, devices: int, stages: int) -> None:
        """Raise BalanceError for values that cannot describe ``devices`` devices."""
        if not self.bandwidth > 0:
            raise BalanceError(f"--bandwidth must be positive, got {self.bandwidth:g}")
        if not self.flops_rate > 0:
            raise BalanceError(f"--flops-rate must be positive, got {self.flops_rate:g}")
        if self.device_speed and len(self.device_speed) not in (1, devices):
            raise BalanceError(
                f"--device-speed gives {len(self.device_speed)} speeds for {devices} devices; "
                "give one per device (or one for all)"
            )
        if any(not s > 0 for s in self.device_speed):
            raise BalanceError(f"--device-speed values must be positive: {self.device_speed}")
        if self.memory_limit and len(self.memory_limit) not in (1, devices):
            raise BalanceError(
                f"--memory-limit gives {len(self.memory_limit)} sizes for {devices} devices; "
                "give one per device (or one for all)"
            )
        if self.optimizer_states < 0:
            raise BalanceError("--optimizer-states must be 0 or more")
        if self.workers is not None and self.workers < stages:
            raise BalanceError(
                f"--workers {self.workers} cannot run {stages} stages; give at least {stages}"
            )

    def speed(self, device: int) -> float:
        if not self.device_speed:
            return 1.0
        return self.device_speed[0 if len(self.device_speed) == 1 else device]

    def limit(self, device: int) -> int | None:
        if not self.memory_limit:
            return None
        return self.memory_limit[0 if len(self.memory_limit) == 1 else device]


def parse_rate(text: str, flag: str) -> float:
    """A bandwidth such as ``10GB/s``, ``25GiB`` or ``1e10`` (bytes per second)."""
    body = text.strip().removesuffix("/s").removesuffix("ps")
    try:
        return float(body)
    except ValueError:
        pass
    try:
        return float(parse_size(body))
    except ValueError:
        raise BalanceError(
            f"{flag} {text!r}: write bytes per second, e.g. 10GB/s, 25GiB/s or 1e10"
        ) from None


def parse_speeds(text: str) -> tuple[float, ...]:
    """``1,1,0.5,0.5``: one relative speed per device."""
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise BalanceError(
            f"--device-speed {text!r}: write one number per device, e.g. 1,1,0.5,0.5"
        ) from None


def parse_limits(text: str) -> tuple[int, ...]:
    """``16GiB`` or ``16GiB,16GiB,8GiB,8GiB``: bytes per device."""
    try:
        return tuple(parse_size(v) for v in text.split(","))
    except ValueError as err:
        raise BalanceError(f"--memory-limit: {err}") from None


def scaled_speeds(machine: CostModel, devices: Sequence[int]) -> list[int]:
    """Per stage, an integer time multiplier (1000 at speed 1) for the device it runs on."""
    return [max(1, round(1000 / machine.speed(d))) for d in devices]
