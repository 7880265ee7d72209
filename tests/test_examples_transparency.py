"""Every example, 1-4 stages: emitted stages reproduce the model, GPipe gradients equal eager."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch.utils import _pytree as pytree

from pipecompile.ir.graph.microbatch import split_microbatches
from pipecompile.ir.graph.noise_floor import Tolerance
from pipecompile.runtime.check.step import check_step
from pipecompile.runtime.pipeline import Pipeline
from tests.conftest import EXAMPLE_NAMES, STAGE_COUNTS, example_spec

HERE = Path(__file__).resolve().parent


def test_stages_from_disk_chain_without_the_compiler(compiled_examples, tmp_path):
    """A separate interpreter that imports only torch and safetensors chains the stage files."""
    cases = []
    for (name, stages), directory in sorted(compiled_examples.items()):
        spec = example_spec(name)
        micro = split_microbatches(spec.inputs, 2)[0]  # stages are compiled for one micro-batch
        with torch.no_grad():
            want = pytree.tree_leaves(spec.model(**micro))
        inputs, expected = tmp_path / f"{name}{stages}_in.st", tmp_path / f"{name}{stages}_out.st"
        save_file({k: v.contiguous() for k, v in micro.items()}, inputs)
        save_file({str(k): v.contiguous() for k, v in enumerate(want)}, expected)
        cases.append({"dir": str(directory), "inputs": str(inputs), "expected": str(expected)})
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    result = subprocess.run(
        [sys.executable, str(HERE / "standalone_chain.py"), str(tmp_path / "cases.json")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("ok  ") == len(EXAMPLE_NAMES) * len(STAGE_COUNTS), result.stdout


@pytest.mark.parametrize("stages", STAGE_COUNTS)
@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_gpipe_step_equals_eager(compiled_examples, name, stages):
    spec = example_spec(name)
    pipe = Pipeline.load(compiled_examples[(name, stages)])
    report = check_step(
        pipe, spec.model, spec.inputs, spec.targets, spec.loss_fn, tolerance=Tolerance(1e-6, 1e-5)
    )
    assert report.ok, str(report)
    assert report.grad_diff < 1e-5


def test_tied_embedding_is_one_parameter_across_stages(compiled_examples):
    manifest = json.loads((compiled_examples[("gpt", 4)] / "manifest.json").read_text())
    holders = [
        (j, name)
        for j, s in enumerate(manifest["stages"])
        for name, originals in s["params"].items()
        if set(originals) == {"wte.weight", "lm_head.weight"}
    ]  # fmt: skip
    assert [j for j, _ in holders] == [0, 3]
    program = (compiled_examples[("gpt", 4)] / "program.txt").read_text()
    assert "0ALLREDUCE_TIED" in program and "3ALLREDUCE_TIED" in program


def test_tied_copies_stay_identical_after_steps(compiled_examples):
    spec = example_spec("gpt")
    pipe = Pipeline.load(compiled_examples[("gpt", 4)])
    pipe.set_optimizer(lambda ps: torch.optim.AdamW(ps, lr=1e-2))
    for _ in range(3):
        pipe.train_step(spec.inputs, spec.targets, spec.loss_fn)
    first = dict(pipe.modules[0].named_parameters())
    last = dict(pipe.modules[3].named_parameters(remove_duplicate=False))
    tied = [n for n, o in pipe.layout.params[0].items() if "lm_head.weight" in o][0]
    tied_last = [n for n, o in pipe.layout.params[3].items() if "lm_head.weight" in o][0]
    assert torch.equal(first[tied], last[tied_last])
    spec.model.load_state_dict(
        {k: v for k, v in pipe.state_dict().items() if k in spec.model.state_dict()}
    )
    assert spec.model.lm_head.weight is spec.model.wte.weight
