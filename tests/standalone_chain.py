"""Chain emitted stages using only torch, safetensors and the manifest - never pipecompile.

Usage: python standalone_chain.py CASES.json, where each case is {"dir": ..., "inputs": ...,
"expected": ...} (safetensors files of the micro-batch inputs and the eager outputs).
Prints one line per case and exits non-zero on any mismatch.
"""

import importlib.util
import json
import sys

from safetensors.torch import load_file, load_model


def load_stage(directory, entry):
    spec = importlib.util.spec_from_file_location(
        f"{entry['class']}_{abs(hash(directory))}", f"{directory}/{entry['file']}"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    stage = getattr(module, entry["class"])()
    load_model(stage, f"{directory}/{entry['weights']}")
    return stage


def chain(directory, inputs):
    with open(f"{directory}/manifest.json") as f:
        manifest = json.load(f)
    values = {name: inputs[name] for name in manifest["inputs"]}
    for entry in manifest["stages"]:
        stage = load_stage(directory, entry)
        outputs = stage(*[values[name] for name in entry["inputs"]])
        assert isinstance(outputs, tuple) and len(outputs) == len(entry["outputs"])
        values.update(zip(entry["outputs"], outputs))
    return [values[name] for name in manifest["outputs"]]


def main():
    failed = 0
    for case in json.load(open(sys.argv[1])):
        got = chain(case["dir"], load_file(case["inputs"]))
        expected = load_file(case["expected"])
        want = [expected[str(k)] for k in range(len(expected))]
        diff = max((g - w).abs().max().item() for g, w in zip(got, want))
        ok = len(got) == len(want) and diff <= 1e-5
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {case['dir']} max|diff| {diff:.3e}")
    assert "pipecompile" not in sys.modules, "the standalone chain imported pipecompile"
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
