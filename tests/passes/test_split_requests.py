"""Manual boundaries: split_point() markers and --split-at, met exactly with the rest balanced."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from pipecompile.balance.min_max_partition import bottleneck, min_max_partition_with_cuts
from pipecompile.errors import BalanceError, TraceError
from pipecompile.model.model_file import load_model_file
from pipecompile.surfaces.cli import main
from tests.conftest import EXAMPLES, write_model_file


def brute(costs, parts, cuts):
    best = None
    for inner in itertools.combinations(range(1, len(costs)), parts - 1):
        if set(cuts) <= {0, *inner}:
            value = bottleneck(costs, [0, *inner])
            best = value if best is None else min(best, value)
    return best


def test_partition_with_cuts_is_exact_against_brute_force():
    rng = random.Random(5)
    for _ in range(300):
        n = rng.randint(2, 9)
        costs = [rng.choice([0, rng.randint(1, 20), rng.randint(50, 100)]) for _ in range(n)]
        cuts = sorted(rng.sample(range(1, n), rng.randint(0, min(3, n - 1))))
        parts = rng.randint(len(cuts) + 1, n)
        starts = min_max_partition_with_cuts(costs, parts, cuts)
        assert len(starts) == parts and set(cuts) <= set(starts) and starts == sorted(set(starts))
        assert bottleneck(costs, starts) == brute(costs, parts, cuts)


def stage_modules(out) -> list[set[str]]:
    manifest = json.loads((out / "manifest.json").read_text())
    return [
        {".".join(o.split(".")[:2]) for names in s["params"].values() for o in names}
        for s in manifest["stages"]
    ]


def test_split_at_before_and_after_module_paths(tmp_path):
    out = tmp_path / "o"
    args = [str(EXAMPLES / "gpt.py"), "--stages", "4", "--split-at", "h.1"]
    assert main([*args, "--split-at", "after:h.2", "-q", "-o", str(out)]) == 0
    stages = stage_modules(out)
    first = [min(sorted(s)) for s in stages]
    assert any(s >= {"h.1"} and "h.0" not in s for s in stages)  # a stage starts at h.1
    starts_h3 = [s for s in stages if "h.3" in s]
    assert starts_h3 and all("h.2" not in s for s in starts_h3), first  # ... and at h.3
    assert main(["run", str(out), "--check"]) == 0


def test_split_at_works_for_export_traced_models(tmp_path):
    out = tmp_path / "o"
    args = [str(EXAMPLES / "hf_gpt2.py"), "--stages", "3", "--split-at", "transformer.h.1"]
    assert main([*args, "-q", "-o", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    later = [names for s in manifest["stages"][1:] for names in s["params"].values()]
    assert any(n.startswith("transformer.h.1.") for names in later for n in names)
    assert not any(
        n.startswith("transformer.h.1.") for names in manifest["stages"][0]["params"].values()
        for n in names
    )  # fmt: skip


MARKED = """
import torch
import pipecompile


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(6))

    def forward(self, x):
        for k, layer in enumerate(self.layers):
            x = torch.tanh(layer(x))
            if k == 0:
                pipecompile.split_point()
        return x


def build_model():
    torch.manual_seed(0)
    return Net()


def example_inputs():
    return (torch.randn(8, 16),)


def example_targets():
    return (torch.randn(8, 16),)


def loss_fn(out, target):
    return torch.nn.functional.mse_loss(out, target)
"""


def test_split_point_starts_a_stage_and_leaves_no_trace(tmp_path):
    path = write_model_file(tmp_path, MARKED)
    out = tmp_path / "o"
    assert main([str(path), "--stages", "2", "-q", "-o", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(o for names in manifest["stages"][0]["params"].values() for o in names) == [
        "layers.0.bias",
        "layers.0.weight",
    ]  # the marker after layer 0 beats the balanced split (3 layers each)
    for source in out.glob("stage_*.py"):
        text = source.read_text()
        imports = [ln for ln in text.splitlines() if ln.startswith(("import", "from"))]
        assert imports == ["import torch"] and "split_point" not in text
    assert main(["run", str(out), "--check"]) == 0
    spec = load_model_file(str(path))
    spec.model(**spec.inputs)  # still runs eagerly


def test_split_point_needs_the_fx_tracer(tmp_path):
    source = MARKED.replace(
        "        for k, layer",
        "        int(x.shape[0])  # fx cannot trace this\n        for k, layer",
    )
    path = write_model_file(tmp_path, source)
    with pytest.raises(TraceError, match="calls pipecompile.split_point\\(\\).*--split-at"):
        from pipecompile.compiler import compile_model

        spec = load_model_file(str(path))
        compile_model(spec.model, spec.inputs, stages=2)


def test_boundary_where_a_tuple_crosses_is_refused(tmp_path):
    source = MARKED.replace(
        "            x = torch.tanh(layer(x))\n            if k == 0:\n"
        "                pipecompile.split_point()\n",
        "            parts = layer(x).chunk(2, dim=1)\n"
        "            if k == 0:\n"
        "                pipecompile.split_point()  # the tuple 'parts' would cross here\n"
        "            x = torch.tanh(torch.cat([parts[0], parts[1]], dim=1))\n",
    )
    assert "the tuple" in source
    path = write_model_file(tmp_path, source)
    from pipecompile.compiler import compile_model

    spec = load_model_file(str(path))
    with pytest.raises(BalanceError, match="split_point\\(\\) asks for a stage to start at"):
        compile_model(spec.model, spec.inputs, stages=2)


def test_pinned_cost_moves_the_balanced_boundary(tmp_path):
    out = tmp_path / "o"
    args = [str(EXAMPLES / "mlp.py"), "--stages", "2", "-q", "-o", str(out)]
    assert main([*args, "--pin-cost", "fc5=1e12"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    last = {o for names in manifest["stages"][1]["params"].values() for o in names}
    assert last == {"fc5.weight", "fc5.bias"}  # fc5 alone outweighs everything else
    assert main([*args, "--pin-cost", "fc1=1e12"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    first = {o for names in manifest["stages"][0]["params"].values() for o in names}
    assert first == {"fc1.weight", "fc1.bias"}


@pytest.mark.parametrize(
    "pin, message", [("fc9=5", "no op runs inside module 'fc9'"), ("fc1", "write MODULE_PATH=COST")]
)
def test_bad_pins_are_errors(tmp_path, capsys, pin, message):
    args = [str(EXAMPLES / "mlp.py"), "--stages", "2", "-q", "-o", str(tmp_path / "o")]
    assert main([*args, "--pin-cost", pin]) == 2
    assert message in capsys.readouterr().err
