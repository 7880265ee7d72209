"""A schedule program: for each device, the ordered instructions it executes in one step."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from pipecompile.errors import ProgramError
from pipecompile.ir.programs.instr import Instr, Op
from pipecompile.ir.records.sizes import counted

__all__ = ["Program"]


@dataclass(frozen=True)
class Program:
    """Per-device instruction lists plus the facts needed to read them.

    ``devices[d]`` is the instruction tuple of device ``d``; ``stage_device[j]`` is the device
    stage ``j`` runs on. The text form is a header comment, then ``device d`` and one
    instruction per line; ``Program.parse(str(p)) == p``.
    """

    schedule: str
    microbatches: int
    stage_device: tuple[int, ...]
    devices: tuple[tuple[Instr, ...], ...] = field(default_factory=tuple)

    @property
    def num_stages(self) -> int:
        return len(self.stage_device)

    @property
    def asynchronous(self) -> bool:
        """Whether stages update within the step (``UPDATE``, PipeDream's schedules) instead
        of once after it."""
        return any(x.op == Op.UPDATE for _, _, x in self.instructions())

    def instructions(self) -> Iterator[tuple[int, int, Instr]]:
        """Yield ``(device, position, instr)`` for every instruction."""
        for d, instrs in enumerate(self.devices):
            for k, instr in enumerate(instrs):
                yield d, k, instr

    def show_around(self, device: int, position: int, radius: int = 3) -> str:
        """The instructions of ``device`` near ``position``, the one at ``position`` marked."""
        instrs = self.devices[device]
        lo, hi = max(0, position - radius), min(len(instrs), position + radius + 1)
        rows = [f"device {device}:"]
        for k in range(lo, hi):
            mark = ">>" if k == position else "  "
            rows.append(f"  {mark} [{k}] {instrs[k]}")
        if position >= len(instrs):
            rows.append(f"  >> [{position}] (end of device {device})")
        return "\n".join(rows)

    def __str__(self) -> str:
        placement = " ".join(str(d) for d in self.stage_device)
        lines = [
            f"# pipecompile program: schedule {self.schedule}, {self.num_stages} stages, "
            f"{counted(self.microbatches, 'micro-batch')}",
            f"# stage -> device: {placement}",
        ]
        for d, instrs in enumerate(self.devices):
            lines.append(f"device {d}")
            lines.extend(f"  {instr}" for instr in instrs)
        return "\n".join(lines) + "\n"

    @classmethod
    def parse(cls, text: str) -> Program:
        """Parse the text form written by ``str``; raises ProgramError naming the bad line."""
        schedule, microbatches, placement = None, None, None
        devices: list[list[Instr]] = []
        for lineno, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if line.startswith("# pipecompile program:"):
                schedule, microbatches = _parse_header(line, lineno)
            elif line.startswith("# stage -> device:"):
                placement = tuple(int(t) for t in line.split(":", 1)[1].split())
            elif not line or line.startswith("#"):
                continue
            elif line.startswith("device"):
                _expect_device_header(line, len(devices), lineno)
                devices.append([])
            elif not devices:
                raise ProgramError(f"line {lineno}: instruction {line!r} before any 'device' line")
            else:
                try:
                    devices[-1].append(Instr.parse(line))
                except ProgramError as err:
                    raise ProgramError(f"line {lineno}: {err}") from None
        if schedule is None or microbatches is None or placement is None:
            raise ProgramError(
                "program text lacks its header lines '# pipecompile program: ...' and "
                "'# stage -> device: ...'; start from a program pipecompile wrote"
            )
        return cls(schedule, microbatches, placement, tuple(tuple(d) for d in devices))


def _parse_header(line: str, lineno: int) -> tuple[str, int]:
    # "# pipecompile program: schedule NAME, 4 stages, 8 micro-batches"
    try:
        body = line.split(":", 1)[1]
        parts = [p.split() for p in body.split(",")]
        return parts[0][1], int(parts[2][0])
    except (IndexError, ValueError):
        raise ProgramError(f"line {lineno}: malformed program header {line!r}") from None


def _expect_device_header(line: str, expected: int, lineno: int) -> None:
    fields = line.split()
    if len(fields) != 2 or not fields[1].isdigit() or int(fields[1]) != expected:
        raise ProgramError(
            f"line {lineno}: expected 'device {expected}', found {line!r} "
            "(devices are listed in order from 0)"
        )
