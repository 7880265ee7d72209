"""Measured timelines: what each device did in the traced steps, as wall-clock spans.

A ``Tracer`` wraps the instruction handlers and the backend's blocking receive while a traced
step runs; otherwise nothing is wrapped, so a run without ``--trace`` pays nothing. Spans are
kept per device on two tracks, ``compute`` (forwards, backwards, the loss, the optimizer, the
data) and ``communication`` (sends, receives, all-reduces), plus one ``step`` span per step.
Spans inside an instruction's are kept too: the ``loss`` inside the last stage's forward, the
``recompute`` of a dropped forward (FC) inside its backward, the ``wait`` inside a receive.
Nothing is recorded between steps (an evaluation after a step is no part of it, and its spans
would count for the step). Times are ``time.time_ns()`` based, so the spans of ranks on one
machine share a clock. ``trace_file`` turns them into a Chrome/Perfetto trace."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, TypedDict, Unpack

from pipecompile.ir.programs.instr import Instr, Op
from pipecompile.runtime.backend import MessageKey
from pipecompile.runtime.interpreter import Handler

__all__ = [
    "CATEGORY",
    "DeviceSpan",
    "MeasuredSpan",
    "SpanArgs",
    "SpanTimes",
    "TRACKS",
    "Tracer",
    "traced",
]

TRACKS = ("compute", "communication", "step")
CATEGORY: dict[Op, str] = {
    Op.F: "forward",
    Op.FC: "forward",  # its activations dropped; the backward recomputes them
    Op.B: "backward",
    Op.I: "backward",
    Op.W: "weight-gradient",
    Op.SEND_F: "send",
    Op.SEND_B: "send",
    Op.RECV_F: "receive",
    Op.RECV_B: "receive",
    Op.ALLREDUCE_TIED: "all-reduce",
    Op.ALLREDUCE_REPLICAS: "all-reduce",
    Op.STEP: "optimizer",
    Op.UPDATE: "optimizer",
    Op.STASH: "optimizer",
}
_COMMUNICATION = {"send", "receive", "all-reduce"}


class SpanArgs(TypedDict, total=False):
    """What a span names besides its times: the instruction's stage and micro-batch."""

    stage: int
    microbatch: int


class SpanTimes(TypedDict):
    """A span as JSON: what the trace file keeps of it, and what its measured costs read."""

    name: str
    category: str
    start: int  # ns
    end: int
    step: int
    args: SpanArgs


class DeviceSpan(SpanTimes):
    """``MeasuredSpan.as_dict()``: a span with the device and track it ran on."""

    device: int
    track: str


@dataclass
class MeasuredSpan:
    """One thing a device did: ``category`` (see ``CATEGORY``; also ``loss``, ``wait``,
    ``data`` and ``step``) on ``track`` from ``start`` to ``end`` (ns since the epoch)."""

    device: int
    track: str
    name: str
    category: str
    start: int
    end: int
    step: int
    args: SpanArgs = field(default_factory=SpanArgs)

    def as_dict(self) -> DeviceSpan:
        return DeviceSpan(
            device=self.device,
            track=self.track,
            name=self.name,
            category=self.category,
            start=self.start,
            end=self.end,
            step=self.step,
            args=SpanArgs(**self.args),
        )


class Tracer:
    """Records the ``steps`` steps after step ``first`` (a resumed run's saved step; ``steps``
    None: every step). Steps are numbered as the run numbers them, from 1."""

    def __init__(
        self, stage_device: Sequence[int], steps: int | None = None, first: int = 0
    ) -> None:
        self.stage_device = tuple(stage_device)
        self.steps, self.first = steps, first
        self.step = 0
        self.running = False  # inside ``step_span``: between steps nothing is traced
        self.spans: list[MeasuredSpan] = []
        self._offset = time.time_ns() - time.perf_counter_ns()

    @property
    def active(self) -> bool:
        """Whether a traced step runs now."""
        after = self.step - self.first
        return self.running and after >= 1 and (self.steps is None or after <= self.steps)

    def now(self) -> int:
        return time.perf_counter_ns() + self._offset

    def record(
        self,
        device: int,
        track: str,
        name: str,
        category: str,
        start: int,
        **args: Unpack[SpanArgs],
    ) -> None:
        self.spans.append(
            MeasuredSpan(device, track, name, category, start, self.now(), self.step, args)
        )

    @contextmanager
    def span(
        self, device: int, track: str, name: str, category: str, **args: Unpack[SpanArgs]
    ) -> Iterator[None]:
        start = self.now()
        try:
            yield
        finally:
            self.record(device, track, name, category, start, **args)

    def maybe(
        self, device: int, track: str, name: str, category: str, **args: Unpack[SpanArgs]
    ) -> AbstractContextManager:
        """``span`` while a traced step runs, else nothing."""
        if not self.active:
            return nullcontext()
        return self.span(device, track, name, category, **args)

    @contextmanager
    def step_span(self, step: int, devices: Sequence[int]) -> Iterator[None]:
        """Step ``step`` of the run, on each of ``devices``: the spans inside it count for it
        (and only those: what runs after it, before the next, is not traced)."""
        self.step, self.running = step, True
        start = self.now()
        try:
            yield
        finally:
            if self.active:
                for d in devices:
                    self.record(d, "step", f"step {self.step}", "step", start)
            self.running = False

    # -- wrapping the step's handlers and backend ------------------------------------------

    def handlers(self, handlers: Mapping[str, Handler]) -> dict[str, Handler]:
        """``handlers``, each recording a span for the instruction it completes."""
        if not self.active:
            return dict(handlers)
        return {op: self._traced(op, handler) for op, handler in handlers.items()}

    def _traced(self, op: str, handler: Handler) -> Handler:
        category = CATEGORY.get(Op(op), "other")
        track = "communication" if category in _COMMUNICATION else "compute"

        def run(instr: Instr) -> bool:
            start = self.now()
            done = handler(instr)
            if done:
                args = SpanArgs(stage=instr.stage)
                if instr.microbatch is not None:
                    args["microbatch"] = instr.microbatch
                device = self.stage_device[instr.stage]
                self.record(device, track, str(instr), category, start, **args)
            return done

        return run

    def backend(self, backend: Any, device: int | None) -> Any:
        """``backend`` with its receives' waiting recorded (the time ``ready`` blocks), and on
        a rank (``device`` given) the wait for its sends at the end of the step."""
        if not self.active:
            return backend
        return _WaitRecorder(backend, self, device)


def traced(
    tracer: Tracer | None,
    device: int,
    track: str,
    name: str,
    category: str,
    **args: Unpack[SpanArgs],
) -> AbstractContextManager:
    """A span of the traced step running now, if ``tracer`` has one; else nothing."""
    if tracer is None:
        return nullcontext()
    return tracer.maybe(device, track, name, category, **args)


class _WaitRecorder:
    """A backend whose ``ready`` records a ``wait`` span on the receiving device."""

    def __init__(self, inner: Any, tracer: Tracer, device: int | None) -> None:
        self._inner, self._tracer, self._device = inner, tracer, device

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def ready(self, keys: Sequence[MessageKey]) -> bool:
        start = self._tracer.now()
        done = self._inner.ready(keys)
        if done and keys:
            key = keys[0]
            stage = key.dst if key.kind == "F" else key.src
            device = self._tracer.stage_device[stage]
            args = SpanArgs(stage=stage, microbatch=key.microbatch)
            self._tracer.record(device, "communication", "wait", "wait", start, **args)
        return done

    def finish(self) -> Any:
        if self._device is None:
            return self._inner.finish()
        with self._tracer.span(self._device, "communication", "sends complete", "wait"):
            return self._inner.finish()
