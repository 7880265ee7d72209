"""The ``generate`` record of a manifest (docs/FORMAT.md): the decoding step's stages (which
blocks each runs, the files of its prefill and decode modules, its tensors by the model's
names, its KV cache), what each stage's step costs against the training split's, and the
prefill and decode programs. Planned and proved by ``pipecompile.generation.plan``; printed
by `show`."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from pipecompile.files.names import decode_file, prefill_file

__all__ = ["GenerationPlan", "StepStageRecord", "DTYPES"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class StepStageRecord:
    """One decoding stage: its blocks (first, stop), how many values each step (``decode``,
    ``prefill``) hands on (``sends``; the last stage's one is the logits), each of its
    tensors' names in the model (``params``, by the stage module's name: a tied weight has
    several; ``constants``: a tensor the model's state dict lacks, kept in the directory's
    ``generate_constants.safetensors``), the FLOPs of its decode and prefill steps, and the
    sha256 of each file it was written to (a file changed since is refused)."""

    blocks: tuple[int, int]
    sends: dict[str, int]
    params: dict[str, tuple[str, ...]]
    constants: dict[str, str]  # the stage's name -> the model's (a non-persistent buffer's)
    decode_flops: int
    prefill_flops: int
    sha256: dict[str, str] = field(default_factory=dict)  # each file's, by its name


@dataclass(frozen=True)
class GenerationPlan:
    """The ``generate`` record. ``layers[i]`` = (key/value heads, head size) of layer i's
    cache; ``training_blocks``/``training_flops``: the training split's blocks per stage and
    what its decode step would cost on each (the split the decode one is compared with)."""

    model: str
    max_length: int
    lanes: int
    rows: int
    dtype: str
    vocab: int
    layers: tuple[tuple[int, int], ...]
    stages_: tuple[StepStageRecord, ...]
    training_blocks: tuple[tuple[int, int], ...] = ()
    training_flops: tuple[int, ...] = ()

    @property
    def stages(self) -> int:
        return len(self.stages_)

    @property
    def blocks(self) -> tuple[tuple[int, int], ...]:
        return tuple(s.blocks for s in self.stages_)

    def stage_layers(self, stage: int) -> range:
        return range(*self.stages_[stage].blocks)

    def cache_shape(self, layer: int) -> tuple[int, ...]:
        """Layer ``layer``'s keys (or values): lanes, rows, heads, max length, head size."""
        heads, size = self.layers[layer]
        return (self.lanes, self.rows, heads, self.max_length, size)

    def cache_bytes(self, stage: int) -> int:
        total = 0
        for i in self.stage_layers(stage):
            per = 1
            for n in self.cache_shape(i):
                per *= n
            total += 2 * per * DTYPES[self.dtype].itemsize
        return total

    def with_digests(self, sources: dict[str, str]) -> GenerationPlan:
        """The plan recording the sha256 of each stage's ``sources`` (by file name)."""
        import hashlib

        def digests(k: int) -> dict[str, str]:
            names = (decode_file(k), prefill_file(k))
            return {n: hashlib.sha256(sources[n].encode()).hexdigest() for n in names}

        stages = tuple(replace(s, sha256=digests(k)) for k, s in enumerate(self.stages_))
        return replace(self, stages_=stages)

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
            "model": self.model,
            "max_length": self.max_length,
            "lanes": self.lanes,
            "rows": self.rows,
            "dtype": self.dtype,
            "vocab": self.vocab,
            "layers": [list(x) for x in self.layers],
            "stages": [
                {
                    "blocks": list(s.blocks),
                    "decode": decode_file(k),
                    "prefill": prefill_file(k),
                    "sends": s.sends,
                    "params": {k: list(v) for k, v in s.params.items()},
                    "constants": s.constants,
                    "decode_flops": s.decode_flops,
                    "prefill_flops": s.prefill_flops,
                    "cache_bytes": self.cache_bytes(k),
                    "sha256": s.sha256,
                }
                for k, s in enumerate(self.stages_)
            ],
            "training_split": {
                "blocks": [list(b) for b in self.training_blocks],
                "decode_flops": list(self.training_flops),
            },
            "programs": self.programs(),
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> GenerationPlan:
        """The record as written; ValueError (or KeyError, TypeError) where it is not one."""
        stages = tuple(
            StepStageRecord(
                blocks=(int(s["blocks"][0]), int(s["blocks"][1])),
                sends={str(k): int(v) for k, v in s["sends"].items()},
                params={str(k): tuple(str(n) for n in v) for k, v in s["params"].items()},
                constants={str(k): str(v) for k, v in s["constants"].items()},
                decode_flops=int(s["decode_flops"]),
                prefill_flops=int(s["prefill_flops"]),
                sha256={str(k): str(v) for k, v in (s.get("sha256") or {}).items()},
            )
            for s in raw["stages"]
        )
        split = raw.get("training_split") or {}
        plan = cls(
            model=str(raw["model"]),
            max_length=int(raw["max_length"]),
            lanes=int(raw["lanes"]),
            rows=int(raw["rows"]),
            dtype=raw["dtype"],
            vocab=int(raw["vocab"]),
            layers=tuple((int(h), int(d)) for h, d in raw["layers"]),
            stages_=stages,
            training_blocks=tuple((int(a), int(b)) for a, b in split.get("blocks", [])),
            training_flops=tuple(int(f) for f in split.get("decode_flops", [])),
        )
        sizes = (plan.max_length, plan.lanes, plan.rows, plan.vocab, *sum(plan.layers, ()))
        if min(sizes) < 1 or plan.dtype not in DTYPES or not plan.stages_:
            raise ValueError("a size below 1, an unknown dtype or no stages")
        ends = [b for _, b in plan.blocks]
        if plan.blocks[0][0] != 0 or [a for a, _ in plan.blocks[1:]] != ends[:-1]:
            raise ValueError(f"stages' blocks {list(plan.blocks)} are not consecutive from 0")
        if ends[-1] != len(plan.layers):
            raise ValueError(f"stages' blocks end at {ends[-1]}, not at {len(plan.layers)}")
        return plan

    def lines(self) -> list[str]:
        """What `show` prints."""
        total = max(1, sum(s.decode_flops for s in self.stages_))
        out = [
            f"generate: {self.model}, decode and prefill traced with a KV cache, max length "
            f"{self.max_length}, {self.lanes} lane(s) x {self.rows} row(s), KV cache "
            f"{self.dtype}, vocabulary {self.vocab}"
        ]
        for k, s in enumerate(self.stages_):
            a, b = s.blocks
            parts = ["embedding"] if k == 0 else []
            parts.append(f"blocks {a}..{b - 1}" if b > a else "no blocks")
            if k == self.stages - 1:
                parts.append("head, sampling")
            out.append(
                f"  stage {k}: {', '.join(parts)}; KV cache {_size(self.cache_bytes(k))}; "
                f"decode {100 * s.decode_flops / total:.0f}% of a token's FLOPs"
            )
        prefill = max(1, sum(s.prefill_flops for s in self.stages_))
        worst = max(s.prefill_flops for s in self.stages_) / prefill
        words = self._split_words(self.blocks, self.decode_share())
        out.append(f"  decode split: {words}; {100 * worst:.0f}% of a prefill")
        if self.training_blocks:
            shares = [f / total for f in self.training_flops]
            out.append(f"  training split: {self._split_words(self.training_blocks, shares)}")
        one = replace(self, lanes=1).programs()  # every lane's turn is lane 0's, renumbered
        for kind, stages in one.items():
            out.append(f"  {kind} program, lane 0's turn (each lane's in turn, alike):")
            out += [f"    stage {k}: {', '.join(steps)}" for k, steps in enumerate(stages)]
        return out

    def decode_share(self) -> list[float]:
        total = max(1, sum(s.decode_flops for s in self.stages_))
        return [s.decode_flops / total for s in self.stages_]

    @staticmethod
    def _split_words(blocks: tuple[tuple[int, int], ...], shares: list[float]) -> str:
        parts = [f"{b - a}" for a, b in blocks]
        return (
            f"blocks {' | '.join(parts)}, slowest stage {100 * max(shares):.0f}% of a token "
            f"(balanced: {100 / len(blocks):.0f}%)"
        )


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)
