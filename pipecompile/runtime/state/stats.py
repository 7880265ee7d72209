"""What a run measured on each device: micro-batches held, activation bytes stored, and the
time each stage spent computing."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["DeviceStats", "RunStats"]


@dataclass
class DeviceStats:
    """Live and peak counts on one device; bytes are measured only when asked for."""

    inflight: int = 0
    peak_inflight: int = 0
    stored: int = 0
    peak_stored: int = 0

    def hold(self, nbytes: int) -> None:
        self.inflight += 1
        self.peak_inflight = max(self.peak_inflight, self.inflight)
        self.grow(nbytes)

    def grow(self, nbytes: int) -> None:
        self.stored += nbytes
        self.peak_stored = max(self.peak_stored, self.stored)

    def release(self, nbytes: int) -> None:
        self.inflight -= 1
        self.stored -= nbytes


@dataclass
class RunStats:
    devices: list[DeviceStats] = field(default_factory=list)
    forward_ns: dict[int, int] = field(default_factory=dict)  # per stage: F and FC wall time
    backward_ns: dict[int, int] = field(default_factory=dict)  # per stage: B, I and W

    def add_compute(self, stage: int, forward: bool, ns: int) -> None:
        into = self.forward_ns if forward else self.backward_ns
        into[stage] = into.get(stage, 0) + ns

    @property
    def compute_ns(self) -> dict[int, int]:
        """Per stage, forward plus backward wall time."""
        stages = sorted({*self.forward_ns, *self.backward_ns})
        return {j: self.forward_ns.get(j, 0) + self.backward_ns.get(j, 0) for j in stages}

    @classmethod
    def for_devices(cls, count: int) -> RunStats:
        return cls([DeviceStats() for _ in range(count)])

    @property
    def peak_inflight(self) -> tuple[int, ...]:
        return tuple(d.peak_inflight for d in self.devices)

    @property
    def peak_stored(self) -> tuple[int, ...]:
        return tuple(d.peak_stored for d in self.devices)
