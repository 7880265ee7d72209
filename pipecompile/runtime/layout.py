"""The static facts a running pipeline needs, read once from the manifest."""

from __future__ import annotations

import contextlib
import importlib
import re
from dataclasses import dataclass

from torch.utils import _pytree as pytree

from pipecompile.errors import EmitError
from pipecompile.ir.graph.ties import tied_params
from pipecompile.ir.records.manifest import Manifest

__all__ = ["Layout"]


@dataclass(frozen=True)
class Layout:
    """Per stage: ordered input/output names, and who sends what to whom."""

    inputs: tuple[tuple[str, ...], ...]
    outputs: tuple[tuple[str, ...], ...]
    in_edges: tuple[tuple[tuple[str, int], ...], ...]  # stage j: (value, producer stage)
    out_edges: tuple[tuple[tuple[str, int], ...], ...]  # stage j: (value, consumer stage)
    stage_device: tuple[int, ...]
    ties: dict[tuple[str, ...], dict[int, str]]  # logical parameter -> {stage: name there}
    params: tuple[dict[str, tuple[str, ...]], ...]
    model_inputs: tuple[str, ...]
    output_spec: pytree.TreeSpec

    @classmethod
    def from_manifest(cls, manifest: Manifest, stage_device: tuple[int, ...]) -> Layout:
        stages, edges = manifest.stages, manifest.edges
        count = len(stages)
        params = tuple(dict(s.params) for s in stages)
        return cls(
            inputs=tuple(s.inputs for s in stages),
            outputs=tuple(s.outputs for s in stages),
            in_edges=tuple(
                tuple((e.value, e.src) for e in edges if e.dst == j) for j in range(count)
            ),
            out_edges=tuple(
                tuple((e.value, e.dst) for e in edges if e.src == j) for j in range(count)
            ),
            stage_device=stage_device,
            ties=tied_params(params),
            params=params,
            model_inputs=manifest.inputs,
            output_spec=load_output_spec(manifest.output_spec),
        )

    @property
    def last(self) -> int:
        return len(self.inputs) - 1

    def remote(self, a: int, b: int) -> bool:
        return self.stage_device[a] != self.stage_device[b]


def load_output_spec(raw: str) -> pytree.TreeSpec:
    """The model's output structure. A node type (a Hugging Face ``ModelOutput``) is known to
    pytree only once its module is imported: the types the spec names are imported first."""
    try:
        return pytree.treespec_loads(raw)
    except NotImplementedError:
        pass
    for name in sorted(set(re.findall(r'"type": "([\w.]+)"', raw))):
        module = name.rpartition(".")[0]
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    try:
        return pytree.treespec_loads(raw)
    except NotImplementedError as err:
        raise EmitError(
            f"the model's outputs cannot be rebuilt: {err}; import the module defining the "
            "output type before loading, or recompile"
        ) from None
