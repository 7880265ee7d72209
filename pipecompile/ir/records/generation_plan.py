"""The ``generate`` record of a manifest (docs/FORMAT.md): which blocks each decode stage runs,
each stage's KV cache (shape and bytes) and the prefill and decode programs. Planned and proved
by ``pipecompile.generation.plan``; printed by `show`."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

__all__ = ["GenerationPlan", "DTYPES"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class GenerationPlan:
    """The ``generate`` record: ``blocks[k]`` = (first, stop) of stage k's blocks."""

    family: str
    max_length: int
    lanes: int
    rows: int
    dtype: str
    blocks: tuple[tuple[int, int], ...]
    kv_heads: int
    head_size: int

    @property
    def stages(self) -> int:
        return len(self.blocks)

    def cache_shape(self) -> tuple[int, ...]:
        """One block's keys (or values): lanes, rows, heads, max length, head size."""
        return (self.lanes, self.rows, self.kv_heads, self.max_length, self.head_size)

    def cache_bytes(self, stage: int) -> int:
        first, stop = self.blocks[stage]
        per = 1
        for n in self.cache_shape():
            per *= n
        return 2 * (stop - first) * per * DTYPES[self.dtype].itemsize

    def programs(self) -> dict[str, list[list[str]]]:
        """Per stage, the instructions of the first round (prefill: the lanes' prompts) and
        of every later round (decode: stage 0 first waits for the lane's tokens)."""
        out: dict[str, list[list[str]]] = {"prefill": [], "decode": []}
        last = self.stages - 1
        for kind in out:
            for s in range(self.stages):
                steps: list[str] = []
                for lane in range(self.lanes):
                    if s == 0 and kind == "decode":
                        steps.append(f"recv_tokens {lane} from {last}")
                    if s > 0:
                        steps.append(f"recv {lane} from {s - 1}")
                    steps.append(f"forward {lane}")
                    if s < last:
                        steps.append(f"send {lane} to {s + 1}")
                    else:
                        steps.append(f"sample {lane}")
                        steps.append(f"send_tokens {lane} to 0")
                out[kind].append(steps)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "max_length": self.max_length,
            "lanes": self.lanes,
            "rows": self.rows,
            "dtype": self.dtype,
            "kv_heads": self.kv_heads,
            "head_size": self.head_size,
            "stages": [
                {
                    "blocks": list(b),
                    "cache_shape": list(self.cache_shape()),
                    "cache_bytes": self.cache_bytes(k),
                }
                for k, b in enumerate(self.blocks)
            ],
            "programs": self.programs(),
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> GenerationPlan:
        """The record as written; ValueError (or KeyError, TypeError) where it is not one."""
        plan = cls(
            family=raw["family"],
            max_length=int(raw["max_length"]),
            lanes=int(raw["lanes"]),
            rows=int(raw["rows"]),
            dtype=raw["dtype"],
            blocks=tuple((int(a), int(b)) for a, b in (s["blocks"] for s in raw["stages"])),
            kv_heads=int(raw["kv_heads"]),
            head_size=int(raw["head_size"]),
        )
        sizes = (plan.max_length, plan.lanes, plan.rows, plan.kv_heads, plan.head_size)
        if min(sizes) < 1 or plan.dtype not in DTYPES or not plan.blocks:
            raise ValueError("a size below 1, an unknown dtype or no stages")
        ends = [b for _, b in plan.blocks]
        if plan.blocks[0][0] != 0 or [a for a, _ in plan.blocks[1:]] != ends[:-1]:
            raise ValueError(f"stages' blocks {list(plan.blocks)} are not consecutive from 0")
        return plan

    def lines(self) -> list[str]:
        """What `show` prints."""
        out = [
            f"generate: {self.family} decoder, max length {self.max_length}, {self.lanes} "
            f"lane(s) x {self.rows} row(s), KV cache {self.dtype} {list(self.cache_shape())} "
            "per block (keys and values each)"
        ]
        for k, (a, b) in enumerate(self.blocks):
            parts = ["embedding"] if k == 0 else []
            parts.append(f"blocks {a}..{b - 1}" if b > a else "no blocks")
            if k == self.stages - 1:
                parts.append("head, sampling")
            out.append(f"  stage {k}: {', '.join(parts)}; KV cache {_size(self.cache_bytes(k))}")
        one = replace(self, lanes=1).programs()  # every lane's turn is lane 0's, renumbered
        for kind, stages in one.items():
            out.append(f"  {kind} program, lane 0's turn (each lane's in turn, alike):")
            out += [f"    stage {k}: {', '.join(steps)}" for k, steps in enumerate(stages)]
        return out


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)
