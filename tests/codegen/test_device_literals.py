"""Stage code makes its tensors where it runs: the factory ops of an export-traced stage
(aten-level, where device=None means the CPU) take the default device, which a rank on a GPU
sets to its GPU while the program runs."""

import re

import torch

from pipecompile.runtime.load import load_stage, read_manifest
from tests.conftest import EXAMPLES


def test_an_exported_stage_makes_its_tensors_on_the_default_device(tmp_path):
    from pipecompile.surfaces.cli import main

    out = tmp_path / "out"
    assert main([str(EXAMPLES / "hf_gpt2.py"), "--stages", "2", "-q", "-o", str(out)]) == 0
    source = (out / "stage_0.py").read_text()
    assert "torch.ops.aten.arange.default" in source  # export's aten-level factory ops
    assert not re.search(r"device = None[,)]", source)  # no factory op left to the CPU
    manifest = read_manifest(out)
    stage = load_stage(out, manifest.stages[0]).to("meta")
    made: list[torch.device] = []

    class Factories(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            if func is torch.ops.aten.arange.default or func.__name__.startswith("arange"):
                made.append(result.device)
            return result

    ids = torch.zeros(8, 16, dtype=torch.long, device="meta")
    with torch.device("meta"), Factories():
        outputs = stage(ids)
    assert made and all(d.type == "meta" for d in made), made
    assert all(o.device.type == "meta" for o in outputs)
