"""The emitted directory's ``manifest.json`` as typed records, read and written only here.

``Manifest.from_json`` and ``Manifest.to_json`` are the only code that knows the JSON keys;
the file is the one of docs/FORMAT.md (format ``pipecompile/1``), byte for byte: keys in the
same order, an optional key written only when it has a value. Every other layer passes a
``Manifest`` around and reads its attributes.

Example:
    >>> manifest = read_manifest(Path("out/gpt"))  # doctest: +SKIP
    >>> [s.file for s in manifest.stages]  # doctest: +SKIP
    ['stage_0.py', 'stage_1.py']
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipecompile.errors import EmitError, ManifestVersionError
from pipecompile.files.atomic import write_atomically
from pipecompile.files.names import MANIFEST
from pipecompile.ir.graph.dynamic import DynamicDims
from pipecompile.ir.graph.stage_graph import Edge  # the stage graph's, as the manifest lists it
from pipecompile.ir.records.balance_report import BalanceReport
from pipecompile.ir.records.batch_coupling import Coupling
from pipecompile.ir.records.plan_record import PlanRecord

__all__ = [
    "TailRecord",
    "FORMAT",
    "MANIFEST",
    "Manifest",
    "ModelRecord",
    "ValueSpec",
    "Edge",
    "ActivationBytes",
    "StageEntry",
    "WeightsRecord",
    "read_manifest",
    "write_manifest",
    "saved_state",
]

FORMAT = "pipecompile/1"  # the format this pipecompile reads and writes
_REQUIRED = ("format", "inputs", "outputs", "stages", "microbatches", "device_map", "program")

Json = dict[str, Any]


@dataclass(frozen=True)
class ModelRecord:
    """Where the model came from: ``file`` relative to the directory (None when compiled from
    Python), its factory ``name``, the ``tracer``, and the fingerprints of the file and graph;
    ``configs``: a Hugging Face model's own configs, name ``from_pretrained`` reads -> file in
    the directory (None for another model); ``unsaved_buffers``: the buffers the model's own
    ``state_dict()`` leaves out (the stages hold them; a state handed back leaves them out)."""

    file: str | None
    name: str
    tracer: str
    file_sha256: str | None = None
    graph_sha256: str | None = None
    configs: dict[str, str] | None = None
    unsaved_buffers: tuple[str, ...] | None = None

    @classmethod
    def from_json(cls, raw: Json) -> ModelRecord:
        unsaved = raw.get("unsaved_buffers")
        return cls(
            raw.get("file"),
            raw.get("name", ""),
            raw.get("tracer", ""),
            raw.get("file_sha256"),
            raw.get("graph_sha256"),
            raw.get("configs"),
            tuple(unsaved) if unsaved else None,
        )

    def to_json(self) -> Json:
        raw: Json = {
            "file": self.file,
            "name": self.name,
            "tracer": self.tracer,
            "file_sha256": self.file_sha256,
            "graph_sha256": self.graph_sha256,
        }
        raw |= {"configs": self.configs} if self.configs else {}
        return raw | (
            {"unsaved_buffers": list(self.unsaved_buffers)} if self.unsaved_buffers else {}
        )


@dataclass(frozen=True)
class ValueSpec:
    """A model input's shape and dtype per micro-batch (``input_values``)."""

    value: str
    shape: tuple[int, ...]
    dtype: str

    @classmethod
    def from_json(cls, raw: Json) -> ValueSpec:
        return cls(raw["value"], tuple(raw["shape"]), raw["dtype"])

    def to_json(self) -> Json:
        return {"value": self.value, "shape": list(self.shape), "dtype": self.dtype}


def _edge_from_json(raw: Json) -> Edge:
    shape = tuple(raw["shape"])
    return Edge(raw["value"], raw["src"], raw["dst"], shape, raw["dtype"], raw["bytes"])


def _edge_to_json(edge: Edge) -> Json:
    return {
        "value": edge.value,
        "src": edge.src,
        "dst": edge.dst,
        "shape": list(edge.shape),
        "dtype": edge.dtype,
        "bytes": edge.nbytes,
    }


@dataclass(frozen=True)
class ActivationBytes:
    """Bytes one micro-batch keeps on a stage between forward and backward: all ``saved``,
    or only its ``inputs`` when the forward is recomputed."""

    saved: int
    inputs: int

    def to_json(self) -> Json:
        return {"saved": self.saved, "inputs": self.inputs}


@dataclass(frozen=True)
class StageEntry:
    """One entry of ``stages``: the stage's files, values, parameter names and sizes.

    ``weights`` is None when no stage file holds its tensors (they come from
    ``from_pretrained``, the JSON key ``from_checkpoint``: stage name -> name in the pretrained
    weights, and ``from_init``); the fields after ``device`` are None in a manifest
    written before they existed (``onnx``: until the stages are exported).
    """

    file: str
    class_name: str
    weights: str | None
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    params: dict[str, tuple[str, ...]]
    flops: int
    param_bytes: int
    device: int | None = None
    activation_bytes: ActivationBytes | None = None
    layers: tuple[tuple[str, int], ...] | None = None
    random_ops: tuple[str, ...] | None = None
    from_pretrained: dict[str, str] | None = None
    from_init: dict[str, str] | None = None
    onnx: str | None = None

    @classmethod
    def from_json(cls, raw: Json) -> StageEntry:
        act, layers, randoms = raw.get("activation_bytes"), raw.get("layers"), raw.get("random_ops")
        return cls(
            file=raw["file"],
            class_name=raw["class"],
            weights=raw.get("weights"),
            inputs=tuple(raw["inputs"]),
            outputs=tuple(raw["outputs"]),
            params={name: tuple(originals) for name, originals in raw.get("params", {}).items()},
            flops=raw.get("flops", 0),
            param_bytes=raw.get("param_bytes", 0),
            device=raw.get("device"),
            activation_bytes=ActivationBytes(act["saved"], act["inputs"]) if act else None,
            layers=tuple((path, ops) for path, ops in layers) if layers is not None else None,
            random_ops=tuple(randoms) if randoms is not None else None,
            from_pretrained=raw.get("from_checkpoint"),
            from_init=raw.get("from_init"),
            onnx=raw.get("onnx"),
        )

    def to_json(self) -> Json:
        raw: Json = {
            "file": self.file,
            "class": self.class_name,
            "weights": self.weights,
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "params": {name: list(originals) for name, originals in self.params.items()},
            "flops": self.flops,
            "param_bytes": self.param_bytes,
        }
        optional = {
            "device": self.device,
            "activation_bytes": self.activation_bytes and self.activation_bytes.to_json(),
            "layers": None if self.layers is None else [[p, n] for p, n in self.layers],
            "random_ops": None if self.random_ops is None else list(self.random_ops),
            "from_checkpoint": self.from_pretrained or None,
            "from_init": self.from_init or None,
            "onnx": self.onnx,
        }
        return raw | {k: v for k, v in optional.items() if v is not None}


@dataclass(frozen=True)
class WeightsRecord:
    """Where the stages' tensors come from (``source``: ``stage_files``, ``checkpoint``: the
    pretrained weights, or ``init``) and what a compile with ``--weights`` found in the
    pretrained weights (``pretrained``, the JSON key ``checkpoint``: their path)."""

    source: str
    init: str | None = None
    seed: int | None = None
    init_constants: str | None = None
    shards: tuple[str, ...] | None = None
    pretrained: str | None = None
    loaded: int | None = None
    model_tensors: int | None = None
    prefix: dict[str, str] | None = None
    missing: tuple[str, ...] | None = None

    @classmethod
    def from_json(cls, raw: Json) -> WeightsRecord:
        shards, missing = raw.get("shards"), raw.get("missing")
        return cls(
            source=raw.get("source", "stage_files"),
            init=raw.get("init"),
            seed=raw.get("seed"),
            init_constants=raw.get("init_constants"),
            shards=tuple(shards) if shards is not None else None,
            pretrained=raw.get("checkpoint"),
            loaded=raw.get("loaded"),
            model_tensors=raw.get("model_tensors"),
            prefix=raw.get("prefix"),
            missing=tuple(missing) if missing is not None else None,
        )

    def to_json(self) -> Json:
        raw: Json = {"source": self.source}
        if self.init is not None:
            raw |= {"init": self.init, "seed": self.seed}
        fields = {
            "init_constants": self.init_constants,
            "shards": None if self.shards is None else list(self.shards),
            "checkpoint": self.pretrained,
            "loaded": self.loaded,
            "model_tensors": self.model_tensors,
            "prefix": self.prefix,
            "missing": None if self.missing is None else list(self.missing),
        }
        return raw | {k: v for k, v in fields.items() if v is not None}


@dataclass(frozen=True)
class TailRecord:
    """The batch-coupled tail (``tail``): its ``file`` and class, the body's outputs it takes
    joined (``inputs``, the manifest's ``outputs`` in order), the model's outputs it returns
    and their structure (``output_spec``)."""

    file: str
    cls: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    output_spec: str

    def to_json(self) -> Json:
        return {
            "file": self.file,
            "class": self.cls,
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "output_spec": self.output_spec,
        }

    @classmethod
    def from_json(cls, raw: Json) -> TailRecord:
        return cls(
            str(raw["file"]),
            str(raw["class"]),
            tuple(raw["inputs"]),
            tuple(raw["outputs"]),
            str(raw["output_spec"]),
        )


@dataclass(frozen=True)
class Manifest:
    """An emitted directory's manifest (docs/FORMAT.md); None marks a key that a manifest
    written by an earlier pipecompile lacks; ``balance`` is the balancer's report
    (``BalanceReport``)."""

    format: str
    pipecompile_version: str | None
    model: ModelRecord | None
    inputs: tuple[str, ...]
    input_values: tuple[ValueSpec, ...] | None
    outputs: tuple[str, ...]
    output_spec: str
    batch_dim: int
    microbatches: int
    microbatch_size: int | None
    schedule: str
    device_map: tuple[int, ...]
    replicas: tuple[int, ...] | None
    balance: BalanceReport | None
    program: str
    stages: tuple[StageEntry, ...]
    edges: tuple[Edge, ...]
    weights: WeightsRecord | None
    compile: str | None = None  # `--compile`: the torch.compile backend runs use by default
    plan: PlanRecord | None = None  # `--devices`: the plan the search chose and the runners-up
    dynamic: DynamicDims = DynamicDims()  # `--dynamic`: dimensions batches may vary in
    generate: Json | None = None  # `--generate`: the decoding plan (generation.plan)
    # where the model mixes the samples of a batch (passes/batch_coupling); None: not analysed
    batch_coupling: tuple[Coupling, ...] | None = None
    tail: TailRecord | None = None  # the batch-coupled tail, run once a step (tail.py)

    @property
    def replica_counts(self) -> tuple[int, ...]:
        """Ranks per stage: ``replicas``, or one each where the manifest has none."""
        return self.replicas or (1,) * len(self.stages)

    @classmethod
    def from_json(cls, raw: object, *, path: Path | str = MANIFEST) -> Manifest:
        """Read the parsed JSON of a manifest.

        Raises:
            ManifestVersionError: its ``format`` is not this pipecompile's (a newer one wrote
                it, or another program); names ``path`` and says to recompile.
            EmitError: it is not a JSON object, lacks a required key, or a value has the
                wrong type; names ``path``.
        """
        if not isinstance(raw, dict):
            raise EmitError(f"{path} is not a pipecompile manifest; recompile the model")
        missing = [key for key in _REQUIRED if key not in raw]
        if missing:
            raise EmitError(f"{path} lacks {', '.join(missing)}; recompile the model")
        if raw["format"] != FORMAT:
            by = raw.get("pipecompile_version")
            raise ManifestVersionError(
                f"{path} has format {raw['format']!r}"
                f"{f' (written by pipecompile {by})' if isinstance(by, str) else ''}; this "
                f"pipecompile reads {FORMAT}: recompile the model with this pipecompile "
                "(`pipecompile MODEL --stages N -o DIR`)"
            )
        try:
            return cls._parse(raw)
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            what = f"{type(err).__name__}: {err}"
            raise EmitError(f"{path} is malformed ({what}); recompile the model") from None

    @classmethod
    def _parse(cls, raw: Json) -> Manifest:
        model, values = raw.get("model"), raw.get("input_values")
        replicas, weights = raw.get("replicas"), raw.get("weights")
        return cls(
            format=raw["format"],
            pipecompile_version=raw.get("pipecompile_version"),
            model=ModelRecord.from_json(model) if model is not None else None,
            inputs=tuple(raw["inputs"]),
            input_values=tuple(map(ValueSpec.from_json, values)) if values is not None else None,
            outputs=tuple(raw["outputs"]),
            output_spec=raw["output_spec"],
            batch_dim=int(raw.get("batch_dim", 0)),
            microbatches=int(raw["microbatches"]),
            microbatch_size=raw.get("microbatch_size"),
            schedule=raw["schedule"],
            device_map=tuple(raw["device_map"]),
            replicas=tuple(replicas) if replicas is not None else None,
            balance=BalanceReport.from_json(raw.get("balance")),
            program=raw["program"],
            stages=tuple(map(StageEntry.from_json, raw["stages"])),
            edges=tuple(map(_edge_from_json, raw.get("edges", []))),
            weights=WeightsRecord.from_json(weights) if weights is not None else None,
            compile=raw.get("compile"),
            plan=PlanRecord.from_json(raw.get("plan")),
            dynamic=DynamicDims.from_json(raw.get("dynamic")),
            generate=raw.get("generate"),
            batch_coupling=_couplings(raw.get("batch_coupling")),
            tail=TailRecord.from_json(raw["tail"]) if raw.get("tail") is not None else None,
        )

    def to_json(self) -> Json:
        """The JSON object of docs/FORMAT.md, keys in the order a compile writes them."""
        optional = {
            "input_values": self.input_values,
            "replicas": self.replicas,
            "balance": self.balance,
            "weights": self.weights,
            "compile": self.compile,
            "plan": self.plan,
            "dynamic": self.dynamic.to_json() if self.dynamic.sizes or self.dynamic.fixed else None,
            "generate": self.generate,
            "batch_coupling": self.batch_coupling,
            "tail": self.tail,
        }
        raw: Json = {
            "format": self.format,
            "pipecompile_version": self.pipecompile_version,
            "model": self.model.to_json() if self.model is not None else None,
            "inputs": list(self.inputs),
            "input_values": [v.to_json() for v in self.input_values or ()],
            "outputs": list(self.outputs),
            "output_spec": self.output_spec,
            "batch_dim": self.batch_dim,
            "microbatches": self.microbatches,
            "microbatch_size": self.microbatch_size,
            "schedule": self.schedule,
            "device_map": list(self.device_map),
            "replicas": list(self.replicas or ()),
            "balance": self.balance.as_json() if self.balance is not None else None,
            "program": self.program,
            "stages": [s.to_json() for s in self.stages],
            "edges": [_edge_to_json(e) for e in self.edges],
            "weights": self.weights.to_json() if self.weights is not None else None,
            "compile": self.compile,
            "plan": self.plan.as_json() if self.plan is not None else None,
            "dynamic": optional["dynamic"],
            "generate": self.generate,
            "batch_coupling": [c.to_json() for c in self.batch_coupling or ()],
            "tail": self.tail.to_json() if self.tail is not None else None,
        }
        return {k: v for k, v in raw.items() if k not in optional or optional[k] is not None}

    def __str__(self) -> str:
        return json.dumps(self.to_json(), indent=2)


def _couplings(raw: object) -> tuple[Coupling, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise TypeError(f"batch_coupling is {type(raw).__name__}, not a list")
    return tuple(Coupling.from_json(c) for c in raw)


def saved_state(state: dict[str, Any], manifest: Manifest) -> dict[str, Any]:
    """``state`` (a pipeline's, by the model's names) as the model's own ``state_dict()``
    holds it: without the buffers it registered as not persistent (``unsaved_buffers``)."""
    unsaved = set(manifest.model.unsaved_buffers or ()) if manifest.model is not None else set()
    return {name: value for name, value in state.items() if name not in unsaved}


def read_manifest(directory: Path | str) -> Manifest:
    """The manifest of the emitted directory ``directory``.

    Raises:
        ManifestVersionError: it was written in another format (a newer pipecompile).
        EmitError: ``directory`` is a model file, holds no manifest, or its manifest cannot be
            read or is malformed; the message names the file and says what to pass instead.
    """
    directory = Path(directory)
    path = directory / MANIFEST
    if directory.suffix == ".py" and directory.is_file():
        raise EmitError(
            f"{str(directory)!r} is a model file; this command takes the directory a compile "
            f"writes: compile it first (`pipecompile {directory} --stages N -o DIR`), then pass DIR"
        )
    if not path.is_file():
        raise EmitError(
            f"{str(directory)!r} holds no {MANIFEST}; pass a directory written by "
            "`pipecompile MODEL --stages N -o DIR`"
        )
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise EmitError(f"{path} cannot be read ({err}); recompile the model") from None
    return Manifest.from_json(raw, path=path)


def write_manifest(directory: Path, manifest: Manifest) -> Path:
    """Write ``manifest`` as ``directory/manifest.json``, whole or not at all (through a
    temporary file renamed into place). Returns its path."""
    path = Path(directory) / MANIFEST
    write_atomically(path, json.dumps(manifest.to_json(), indent=2) + "\n")
    return path
