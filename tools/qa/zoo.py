"""Sweep real model zoos through pipecompile: torchvision, timm and Hugging Face transformers.

    python tools/qa/zoo.py                            # every zoo, 2 and 4 stages, with the peer
    python tools/qa/zoo.py --zoo timm --stages 2      # one zoo, one stage count
    python tools/qa/zoo.py --models resnet18,timm:dla34,gpt2 --no-peer
    python tools/qa/zoo.py --jobs 2 --json /tmp/zoo.json     # per-model results as JSON
    python tools/qa/zoo.py --report /tmp/zoo.json     # the table of a JSON (a partial run too)
    python tools/qa/zoo.py --models timm:dla34 --workdir /tmp/z --keep-outputs   # to replay
    python tools/qa/zoo.py --quick                    # what the test suite runs
    python tools/qa/zoo.py --installed --device cuda --sample 20 --stages 2 --no-peer --jobs 8
                      # on a GPU machine: its own torchvision and timm, every stage on its GPU

Each model is written as a model file (``build_model``, ``example_inputs``,
``example_targets``, ``loss_fn``; random weights, seeded, every dropout at p = 0 and the
dropout and drop-path rates 0 where the constructor takes them, training mode, a batch of 8)
into a work folder (``--workdir``, default a temporary one), and then, per stage count S
(``--stages``, default 2 and 4):

    pipecompile MODEL_FILE --stages S --microbatches S -o OUT     # S = 4: --schedule 1f1b
    pipecompile run OUT --check

each in a child process with a time limit (``--timeout``, 300 s), ``--jobs`` models at a time
(default 2); OUT is removed once checked unless ``--keep-outputs``. The outcome per model and
stage count:

* ok: compiled, and ``run --check`` found the pipeline's loss, outputs and gradients equal to
  eager PyTorch's (BatchNorm's statistics per micro-batch on both sides);
* refused: pipecompile stopped with its own one-line error (exit 2, ``pipecompile: error:``,
  no traceback); the message is the reason (a ``run --check`` that stops this way after a
  compile is one too, its reason starting ``run:``);
* wrong: ``run --check`` found a difference (exit 1): the worst bug;
* traceback: a Python traceback, an internal error ("This is a pipecompile bug"), a signal or
  any other exit status;
* hang: a command ran past ``--timeout``;
* skipped: the model did not even build and run eagerly (``skipped (eager)``, with the
  reason), or has more than ``--max-params`` parameters (``skipped (size)``).

A causal LM (Hugging Face's) is also decoded, on ``--device``: compiled again with ``--generate
--max-length 64 --lane-rows 2`` (one micro-batch: decoding has none), then five prompts of 1 to
9 tokens decode up to 8 new tokens through the compiled decoding stages and through Hugging
Face's ``generate(do_sample=False)`` on the model file's model (``zoos/generation_check.py``);
the generation column counts the models whose tokens are equal, and the others are listed with
their outcome (refused, wrong, traceback, hang) and reason.

On a GPU machine, ``--device cuda`` compiles every stage onto one device (``--schedule
interleaved --virtual-stages S``) and checks with ``run --check --nproc 1 --device cuda``: one
NCCL rank on the GPU, its values held to the noise-floor rule against the CPU's, with floors
measured on both. ``--installed`` takes the torchvision and timm the environment already has
(such a machine's image) instead of installing them into ``--zoo-dir``; ``--sample N`` sweeps
N models of each zoo, evenly spaced over its list.

The zoos (``zoos/``): torchvision, every classification model of
``torchvision.models.list_models(module=torchvision.models)`` (10 classes; 64x64 images where
the model takes them, ``aux_logits=False`` for Inception and GoogLeNet); timm, one small variant
of 50-odd families; Hugging Face, 50-odd architectures from tiny configs (2 layers, hidden 64,
``use_cache=False``; causal LMs, sequence classifiers, encoder-decoders, image classifiers).

The peer (``--peer``, on by default; under ``--quick`` on torchvision's model only):
torch.distributed.pipelining's ``pipeline()`` with one ``SplitPoint.BEGINNING`` at the middle
one of the model's top-level children, on one micro-batch; the table counts the models it split
in two, and those it split whose split graph's forward equals the eager model's output
(``zoos/probe.py``, which first runs every model eagerly).

Installing the zoos: torchvision and timm are never installed into the project's environment:
the registry's torchvision wheel is a CUDA build whose C++ ops do not load beside the CPU
torch, and installed in the environment it breaks ``from transformers import ...``. The tool
installs them, when missing, into a folder of their own (``--zoo-dir``, default
``$XDG_CACHE_HOME/pipecompile/zoo``, else ``~/.cache/pipecompile/zoo``: the user's cache, not the
checkout), then empties ``torchvision/_meta_registrations.py`` (it
registers meta kernels for those missing C++ ops, and fails on import). The torchvision release
is the one built for the installed torch (0.28 for torch 2.13: 0.29 wants torch 2.14). timm's
and torchvision's own needs (huggingface_hub, pyyaml, safetensors, pillow) go into the same
folder only where the environment lacks them. Only the generated model files put that folder
on ``sys.path``, when pipecompile (or the probe) imports them: this process, PYTHONPATH and the
environment's site-packages never hold it. By hand::

    python -m pip install -q --no-deps --target ZOO torchvision==0.28.* timm==1.0.31 pillow
    echo '' > ZOO/torchvision/_meta_registrations.py

``--quick`` runs one model of each zoo at 2 stages (each zoo module's ``QUICK``: torchvision's
mnasnet0_5, timm's poolformer_s12, Hugging Face's gpt2; about 30 s on 2 cores once installed),
its commands forked from a process that imported torch and pipecompile once
(``tools/bench/forked.py``) instead of fresh interpreters; where torchvision and timm cannot be
installed (no network), it says so and runs the Hugging Face part.

Output: a table per zoo and stage count (models run, each outcome, ok %, how many compiled into
a stage graph: branches side by side on devices of their own, the causal LMs decoding equal to
Hugging Face's of those decoded, and the peer's counts), then every model that is not ok with
its outcome and reason. Exit status: 1 if any model (or its decoding) is wrong, traceback or
hang (under ``--quick``: if any sample model, or its decoding, is not ok), or a zoo could not
be installed (not under ``--quick``); else 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from itertools import chain, zip_longest
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the zoos package beside this file
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "bench"))  # forked.py

import forked  # noqa: E402
from zoos import hf_models, install, timm_models, torchvision_models  # noqa: E402
from zoos.common import Model, sample  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).resolve().parent / "zoos" / "probe.py"
GENERATION = Path(__file__).resolve().parent / "zoos" / "generation_check.py"
DECODING = ["--generate", "--max-length", "64", "--lane-rows", "2"]  # a causal LM's
ZOOS = {"torchvision": torchvision_models, "timm": timm_models, "hf": hf_models}
NEED_INSTALL = ("torchvision", "timm")
OUTCOMES = ("ok", "refused", "traceback", "wrong", "hang")
QUICK_PEER = ("torchvision", torchvision_models.QUICK[0])
TRACEBACK = "Traceback (most recent call last)"
BUG = "This is a pipecompile bug"


@dataclass
class Result:
    """One model at one stage count."""

    zoo: str
    model: str
    stages: int
    outcome: str  # one of OUTCOMES, or skipped
    reason: str = ""
    seconds: float = 0.0
    params: int | None = None
    peer_split: bool | None = None
    peer_equal: bool | None = None
    peer_reason: str = ""
    shape: str = ""  # the compiled plan's: "chain", or "graph" (branches side by side)
    generation: str = ""  # a causal LM's decoding against Hugging Face's: an outcome, or ""
    generation_reason: str = ""


@dataclass(frozen=True)
class Plan:
    """What every model goes through."""

    stages: tuple[int, ...]
    timeout: float
    max_params: float
    workdir: Path
    peer: frozenset[tuple[str, str]] | None  # (zoo, model) pairs; None: every model
    env: dict[str, str] = field(default_factory=dict)
    keep_outputs: bool = False  # else each compiled folder goes once checked (weights: GBs)
    device: str = "cpu"  # cuda: every stage on one GPU, checked by one NCCL rank
    quick: bool = False  # --quick: a causal LM's training compile decodes too (one compile)

    def wants_peer(self, model: Model) -> bool:
        return self.peer is None or (model.zoo, model.name) in self.peer


@dataclass
class Ran:
    """A finished child process."""

    returncode: int | None  # None: killed at the time limit
    output: str
    seconds: float


def run(command: list[str], timeout: float, env: dict[str, str]) -> Ran:
    """``command`` with a time limit; past it its whole process group is killed. Under --quick
    it is forked from a warm process instead of a fresh interpreter (tools/bench/forked.py)."""
    if forked.QUICK:
        return _run_forked(command, timeout, env)
    start = time.perf_counter()
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env=env,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        code = None
    return Ran(code, output or "", time.perf_counter() - start)


def _run_forked(command: list[str], timeout: float, env: dict[str, str]) -> Ran:
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="zoo-run-") as tmp:
        output = f"{tmp}/output"
        proc = forked.start(command, env=env, cwd=str(ROOT), stdout=output, stderr=output)
        proc.join(timeout)
        code = proc.exitcode
        if code is None:
            forked.stop(proc)
        text = Path(output).read_text(errors="replace") if Path(output).exists() else ""
    return Ran(code, text, time.perf_counter() - start)


def verdict(phase: str, ran: Ran, timeout: float) -> tuple[str, str]:
    """(outcome, reason) of one pipecompile command; ``phase`` is compile or check."""
    text = ran.output
    where = {"compile": "", "check": "run: ", "generate": "generate: "}[phase]
    if ran.returncode is None:
        return "hang", f"{where or 'compile: '}ran past {timeout:.0f} s"
    if TRACEBACK in text:
        return "traceback", where + _exception_line(text)
    error = _error_line(text)
    if BUG in text:
        return "traceback", where + error
    if ran.returncode == 0:
        return "ok", ""
    if phase in ("check", "generate") and ran.returncode == 1:
        return "wrong", _mismatch(text)
    if ran.returncode == 2 and error:
        return "refused", where + error.removeprefix("pipecompile: error: ")
    last = (text.strip().splitlines() or ["no output"])[-1]
    status = f"signal {-ran.returncode}" if ran.returncode < 0 else f"status {ran.returncode}"
    return "traceback", f"{where}exit {status}: {last.strip()[:200]}"


def _exception_line(text: str) -> str:
    """The exception that ends the last traceback."""
    tail = text[text.rindex(TRACEBACK) :].splitlines()[1:]
    lines = [ln for ln in tail if ln.strip() and not ln.startswith((" ", "\t", "^"))]
    return (lines[-1] if lines else "traceback").strip()[:300]


def _error_line(text: str) -> str:
    """pipecompile's last message, with its indented lines (each tracer's reason), on one line."""
    lines = text.splitlines()
    starts = [k for k, line in enumerate(lines) if line.startswith("pipecompile")]
    if not starts:
        return ""
    message = [lines[starts[-1]]]
    for line in lines[starts[-1] + 1 :]:
        if not line.startswith((" ", "\t")):
            break
        message.append(line)
    return " ".join(" ".join(message).split())[:500]


def _mismatch(text: str) -> str:
    """The check's verdict line and its largest differences."""
    diffs = [" ".join(ln.split()) for ln in text.splitlines() if "max |diff|" in ln]
    verdict_line = _error_line(text).removeprefix("pipecompile: ")
    return "; ".join(filter(None, [verdict_line, *diffs]))[:400]


def compile_command(model_file: Path, stages: int, out: Path, device: str = "cpu") -> list[str]:
    command = [
        sys.executable,
        "-m",
        "pipecompile",
        "compile",
        str(model_file),
        "-q",
        "--stages",
        str(stages),
        "--microbatches",
        str(stages),
        "-o",
        str(out),
    ]
    if device == "cuda":  # one device holds every stage: the GPU of one rank
        return command + ["--schedule", "interleaved", "--virtual-stages", str(stages)]
    return command + (["--schedule", "1f1b"] if stages >= 4 else [])


def check_command(out: Path, device: str = "cpu") -> list[str]:
    command = [sys.executable, "-m", "pipecompile", "run", str(out), "--check"]
    return command + (["--nproc", "1", "--device", "cuda"] if device == "cuda" else [])


def at_stages(model_file: Path, stages: int, plan: Plan, generates: bool = False) -> Result:
    """Compile ``model_file`` into ``stages`` stages and check it: a result without the
    model's names. A causal LM (``generates``) is also compiled with ``--generate`` (one
    micro-batch: decoding has none; under ``--quick`` the one compile does both) and decoded
    against Hugging Face's ``generate`` (``zoos/generation_check.py``), both on ``plan.device``
    (the decoding compile is the CPU's: generation places its stages when it runs)."""
    out = model_file.parent / f"out{stages}"
    command = compile_command(model_file, stages, out, plan.device)
    at_once = generates and plan.quick and plan.device == "cpu"
    try:
        built = run(command + (DECODING if at_once else []), plan.timeout, plan.env)
        outcome, reason = verdict("compile", built, plan.timeout)
        done = Result("", "", stages, outcome, reason, built.seconds)
        if outcome == "ok":
            done.shape = _shape(out)
            checked = run(check_command(out, plan.device), plan.timeout, plan.env)
            done.outcome, done.reason = verdict("check", checked, plan.timeout)
            done.seconds += checked.seconds
            if at_once:
                decoded = run([sys.executable, str(GENERATION), str(model_file), str(out)],
                              plan.timeout, plan.env)  # fmt: skip
                done.generation, done.generation_reason = verdict("generate", decoded, plan.timeout)
                done.seconds += decoded.seconds
    finally:
        if not plan.keep_outputs:
            shutil.rmtree(out, ignore_errors=True)
    if generates and not at_once:
        done.generation, done.generation_reason, seconds = decoding(model_file, stages, plan)
        done.seconds += seconds
    return done


def decoding(model_file: Path, stages: int, plan: Plan) -> tuple[str, str, float]:
    """(outcome, reason, seconds) of compiling ``model_file`` with ``--generate`` and
    decoding through it against Hugging Face's greedy ``generate``."""
    out = model_file.parent / f"gen{stages}"
    command = [sys.executable, "-m", "pipecompile", "compile", str(model_file), "-q",
               "--stages", str(stages), "-o", str(out), *DECODING]  # fmt: skip
    try:
        built = run(command, plan.timeout, plan.env)
        outcome, reason = verdict("compile", built, plan.timeout)
        if outcome != "ok":
            return outcome, reason, built.seconds
        check = [sys.executable, str(GENERATION), str(model_file), str(out)]
        check += ["--device", plan.device]
        decoded = run(check, plan.timeout, plan.env)
        return (*verdict("generate", decoded, plan.timeout), built.seconds + decoded.seconds)
    finally:
        if not plan.keep_outputs:
            shutil.rmtree(out, ignore_errors=True)


def _shape(out: Path) -> str:
    """The compiled plan's shape, from its manifest ("" where it says none)."""
    try:
        balance = json.loads((out / "manifest.json").read_text()).get("balance") or {}
    except (OSError, ValueError):
        return ""
    return str(balance.get("shape", ""))


def probe(model_file: Path, model: Model, plan: Plan) -> dict[str, object]:
    """The eager run and the peer's verdict (``zoos/probe.py``); a time limit is a reason."""
    command = [
        sys.executable,
        str(PROBE),
        str(model_file),
        "--microbatches",
        str(min(plan.stages)),
        "--max-params",
        str(plan.max_params),
    ]
    if plan.wants_peer(model):
        command.append("--peer")
    ran = run(command, plan.timeout, plan.env)
    found: dict[str, object] = {}
    for line in ran.output.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):  # a line of a warning's text
                found.update(json.loads(line))
    if "eager" not in found:
        why = "ran past the time limit" if ran.returncode is None else _tail(ran.output)
        found["eager"] = f"probe: {why}"
    params = found.get("params")
    small = not isinstance(params, int) or params <= plan.max_params  # else no peer ran
    if plan.wants_peer(model) and found["eager"] == "ok" and small and "peer_split" not in found:
        why = "hang" if ran.returncode is None else _tail(ran.output)
        found.update(peer_split=False, peer_equal=False, peer_reason=f"peer: {why}")
    return found


def _tail(text: str) -> str:
    return (text.strip().splitlines() or ["no output"])[-1].strip()[:200]


def sweep_model(model: Model, plan: Plan) -> list[Result]:
    """``model`` eagerly, through the peer, and at each stage count."""
    folder = plan.workdir / f"{model.zoo}-{model.name}"
    folder.mkdir(parents=True, exist_ok=True)
    model_file = folder / "model.py"
    model_file.write_text(model.source)
    found = probe(model_file, model, plan)
    peer = {k: found[k] for k in ("peer_split", "peer_equal", "peer_reason") if k in found}
    params = found.get("params")
    base = {"zoo": model.zoo, "model": model.name, "params": params, **peer}
    if found["eager"] != "ok":
        return [
            Result(**base, stages=s, outcome="skipped", reason=f"eager: {found['eager']}")
            for s in plan.stages
        ]
    if isinstance(params, int) and params > plan.max_params:
        why = f"size: {params / 1e6:.0f}M parameters (--max-params {plan.max_params / 1e6:g}M)"
        return [Result(**base, stages=s, outcome="skipped", reason=why) for s in plan.stages]
    results = []
    for stages in plan.stages:
        done = at_stages(model_file, stages, plan, model.generates)
        if done.outcome == "wrong" and not found.get("deterministic", True):
            done.reason += " (the eager model's own output is not deterministic)"
        done.seconds = round(done.seconds, 1)
        results.append(replace(done, **base))
    return results


def sweep(models: list[Model], plan: Plan, jobs: int, json_path: Path | None) -> list[Result]:
    """Every model over ``jobs`` threads (each runs child processes), progress on stderr; the
    JSON file is rewritten after each model, so a run stopped early leaves its results."""
    results: list[Result] = []
    lock = threading.Lock()

    def one(model: Model) -> None:
        start = time.perf_counter()
        found = sweep_model(model, plan)
        with lock:
            results.extend(found)
            done = len({(r.zoo, r.model) for r in results})
            said = ", ".join(f"{r.stages}: {r.outcome}" for r in found)
            took = time.perf_counter() - start
            print(
                f"[{done}/{len(models)}] {model.zoo} {model.name}: {said} ({took:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
            if json_path is not None:
                write_json(results, json_path)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for future in [pool.submit(one, m) for m in models]:
            future.result()
    return sorted(results, key=lambda r: (list(ZOOS).index(r.zoo), r.model, r.stages))


def write_json(results: list[Result], path: Path) -> None:
    path.write_text(json.dumps([asdict(r) for r in results], indent=1) + "\n")


def table(results: list[Result]) -> str:
    """Per zoo and stage count: models run, each outcome, ok %, the models compiled into a
    stage graph (branches side by side), the causal LMs whose decoding equals Hugging Face's
    greedy ``generate`` of those decoded, and the peer's counts."""
    head = [
        "zoo",
        "stages",
        "run",
        *OUTCOMES,
        "skipped",
        "ok %",
        "stage graphs",
        "generation",
        "peer split",
        "peer equal",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    groups: dict[tuple[str, int], list[Result]] = defaultdict(list)
    for r in results:
        groups[(r.zoo, r.stages)].append(r)
    for (zoo, stages), group in sorted(
        groups.items(), key=lambda g: (list(ZOOS).index(g[0][0]), g[0][1])
    ):
        ran = [r for r in group if r.outcome != "skipped"]
        counts = [sum(r.outcome == o for r in ran) for o in OUTCOMES]
        ok = f"{100 * counts[0] / len(ran):.0f}" if ran else "-"
        peers = [r for r in ran if r.peer_split is not None]
        split = sum(bool(r.peer_split) for r in peers)
        equal = sum(bool(r.peer_split and r.peer_equal) for r in peers)
        peer = [f"{split}/{len(peers)}", f"{equal}/{len(peers)}"] if peers else ["-", "-"]
        row = [zoo, str(stages), str(len(ran)), *map(str, counts)]
        graphs = sum(r.shape == "graph" for r in ran)
        decoded = [r for r in ran if r.generation]
        same = sum(r.generation == "ok" for r in decoded)
        generation = f"{same}/{len(decoded)}" if decoded else "-"
        row += [str(len(group) - len(ran)), ok, f"{graphs}/{len(ran)}", generation, *peer]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def not_ok(results: list[Result]) -> str:
    """Every model that is not ok, by outcome, its stage counts with the same reason joined."""
    same: dict[tuple[str, str, str, str], list[int]] = defaultdict(list)
    for r in results:
        if r.outcome != "ok":
            same[(r.outcome, r.zoo, r.model, r.reason)].append(r.stages)
    lines = []
    for outcome in (*OUTCOMES[1:], "skipped"):
        found = sorted((k, v) for k, v in same.items() if k[0] == outcome)
        if found:
            lines.append(f"{outcome} ({len(found)}):")
        for (_, zoo, model, reason), stages in found:
            at = ",".join(map(str, stages))
            lines.append(f"  {zoo} {model} [{at} stages]: {reason}")
    decoding = sorted(
        (r.generation, r.zoo, r.model, r.stages, r.generation_reason)
        for r in results
        if r.generation not in ("", "ok")
    )
    if decoding:
        lines.append(f"generation not equal to Hugging Face's ({len(decoding)}):")
        lines += [f"  {z} {m} [{s} stages] {o}: {why}" for o, z, m, s, why in decoding]
    return "\n".join(lines) if lines else "every model is ok"


def peer_misses(results: list[Result]) -> str:
    """The models the peer did not split in two, or whose split graph differed from eager."""
    seen: dict[tuple[str, str], Result] = {}
    for r in results:
        missed = r.peer_split is not None and not (r.peer_split and r.peer_equal)
        if missed and r.outcome != "skipped":
            seen[(r.zoo, r.model)] = r
    if not seen:
        return ""
    lines = [f"peer (torch.distributed.pipelining) not split or not equal ({len(seen)}):"]
    for (zoo, model), r in sorted(seen.items()):
        what = "not split" if not r.peer_split else "not equal"
        lines.append(f"  {zoo} {model}: {what}: {r.peer_reason}")
    return "\n".join(lines)


def report(results: list[Result]) -> str:
    return "\n\n".join(filter(None, [table(results), not_ok(results), peer_misses(results)]))


def choose(args: argparse.Namespace, zoos: list[str], zoo_dir: str) -> list[Model]:
    """The models to sweep, zoos interleaved (a partial run covers each of them)."""
    wanted = [m for m in (args.models or "").split(",") if m]
    per_zoo: dict[str, list[str]] = {}
    for zoo in zoos:
        module = ZOOS[zoo]
        if args.quick and not wanted:
            per_zoo[zoo] = list(module.QUICK)
        elif not wanted:
            per_zoo[zoo] = sample(module.names(zoo_dir), args.sample)
        else:
            per_zoo[zoo] = _selected(wanted, zoo, module, zoo_dir)
    unknown = [w for w in wanted if not any(w.split(":")[-1] in n for n in per_zoo.values())]
    if unknown:
        sys.exit(f"zoo.py: no model named {', '.join(unknown)} in {', '.join(zoos)}")
    lists = [[ZOOS[zoo].model(name, zoo_dir) for name in names] for zoo, names in per_zoo.items()]
    return [m for m in chain.from_iterable(zip_longest(*lists)) if m is not None]


def _selected(wanted: list[str], zoo: str, module: object, zoo_dir: str) -> list[str]:
    """``zoo:NAME`` (any name the zoo builds) and bare NAMEs in the zoo's list."""
    names = [w.split(":", 1)[1] for w in wanted if w.startswith(f"{zoo}:")]
    bare = [w for w in wanted if ":" not in w]
    if bare:
        listed = module.names(zoo_dir)  # type: ignore[attr-defined]
        names += [w for w in bare if w in listed and w not in names]
    return names


def installed_zoos(zoos: list[str], zoo_dir: Path) -> tuple[list[str], str | None]:
    """The zoos that can run, and why torchvision and timm cannot (None when they can)."""
    if not any(z in NEED_INSTALL for z in zoos):
        return zoos, None
    failure = install.ensure(zoo_dir)
    if failure is None:
        return zoos, None
    return [z for z in zoos if z not in NEED_INSTALL], failure


def child_env(jobs: int) -> dict[str, str]:
    """The children's environment: a share of the cores each, no debug tracebacks."""
    env = {k: v for k, v in os.environ.items() if k != "PIPECOMPILE_DEBUG"}
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // jobs)))
    env["PYTHONWARNINGS"] = "ignore"
    env["PIPECOMPILE_VERIFY"] = "on"  # every compile proves itself (the test suite's turn it off)
    return env


def exit_status(results: list[Result], quick: bool, install_failed: bool) -> int:
    decoded = [r.generation for r in results if r.generation]
    if quick:
        return int(any(r.outcome != "ok" for r in results) or any(g != "ok" for g in decoded))
    bad = any(r.outcome in ("wrong", "traceback", "hang") for r in results)
    bad = bad or any(g in ("wrong", "traceback", "hang") for g in decoded)
    return int(bad or install_failed)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--zoo", default=",".join(ZOOS), help="torchvision,timm,hf (default all)")
    parser.add_argument("--models", help="NAME or ZOO:NAME, comma-separated (default all)")
    parser.add_argument(
        "--stages", type=_stage_counts, help="stage counts, comma-separated (default 2,4)"
    )
    parser.add_argument(
        "--peer",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also torch.distributed.pipelining (default on; --quick: one model)",
    )
    parser.add_argument(
        "--sample", type=int, default=0, help="N models of each zoo, evenly spaced (default all)"
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: compile every stage onto one device (--schedule interleaved) and check on "
        "one GPU rank (run --check --nproc 1 --device cuda) against eager on the CPU",
    )
    parser.add_argument(
        "--installed",
        action="store_true",
        help="the torchvision and timm the environment already has (a GPU machine's image), "
        "not --zoo-dir's",
    )
    parser.add_argument("--jobs", type=_positive(int), default=2, help="models at once (default 2)")
    parser.add_argument(
        "--timeout", type=_positive(float), default=300.0, help="seconds per command"
    )
    parser.add_argument(
        "--max-params",
        type=float,
        default=100e6,
        help="skip models with more parameters (default 100e6)",
    )
    parser.add_argument(
        "--zoo-dir",
        type=Path,
        default=default_zoo_dir(),
        help="where torchvision and timm are installed (default: the user's cache, "
        f"{default_zoo_dir()})",
    )
    parser.add_argument("--workdir", type=Path, help="write the model files here, and keep them")
    parser.add_argument(
        "--keep-outputs", action="store_true", help="keep the compiled folders (default: removed)"
    )
    parser.add_argument("--json", type=Path, help="write the per-model results here")
    parser.add_argument(
        "--report", type=Path, help="print the report of a --json file, run nothing"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="one model per zoo, 2 stages, the peer on one",
    )
    args = parser.parse_args(argv)
    unknown = set(args.zoo.split(",")) - set(ZOOS)
    if unknown:
        parser.error(f"unknown zoo {', '.join(sorted(unknown))}; choose from {', '.join(ZOOS)}")
    if args.report is not None:
        args.results = _read_report(parser, args.report)
    return args


def default_zoo_dir() -> Path:
    """``$XDG_CACHE_HOME/pipecompile/zoo``, else ``~/.cache/pipecompile/zoo``."""
    root = os.environ.get("XDG_CACHE_HOME")
    return (Path(root) if root else Path.home() / ".cache") / "pipecompile" / "zoo"


def _positive(kind: type) -> Any:
    def read(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not value > 0:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number above 0")
        return value

    return read


def _stage_counts(text: str) -> tuple[int, ...]:
    """``2,4`` -> (2, 4): whole numbers of at least 1."""
    try:
        counts = tuple(int(s) for s in text.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not stage counts: whole numbers of at least 1, comma-separated (2,4)"
        )
    return counts


def _read_report(parser: argparse.ArgumentParser, path: Path) -> list[Result]:
    """The results a --json file holds; a usage error naming the file where it cannot."""
    try:
        return [Result(**r) for r in json.loads(path.read_text())]
    except OSError as err:
        parser.error(f"--report {path}: cannot read it ({err.strerror or err})")
    except (ValueError, TypeError) as err:
        parser.error(f"--report {path}: not a --json file of this tool ({type(err).__name__})")


def plan_for(args: argparse.Namespace, workdir: Path) -> Plan:
    stages = args.stages or ((2,) if args.quick else (2, 4))
    peer: frozenset[tuple[str, str]] | None = None
    if args.peer is False:
        peer = frozenset()
    elif args.quick and args.peer is None:
        peer = frozenset([QUICK_PEER])
    return Plan(
        stages,
        args.timeout,
        args.max_params,
        workdir,
        peer,
        child_env(args.jobs),
        args.keep_outputs,
        args.device,
        args.quick,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.report:
        print(report(args.results))
        return 0
    zoo_dir = "" if args.installed else str(args.zoo_dir.resolve())
    zoos, failure = (
        (args.zoo.split(","), None)
        if args.installed
        else installed_zoos(args.zoo.split(","), args.zoo_dir.resolve())
    )
    if failure:
        print(f"note: torchvision and timm left out: {failure}")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="zoo-") as tmp:
        workdir = (args.workdir or Path(tmp)).resolve()
        plan = plan_for(args, workdir)
        models = choose(args, zoos, zoo_dir)
        print(
            f"{len(models)} models, stages {plan.stages}, {args.jobs} jobs, on {args.device}",
            file=sys.stderr,
        )
        results = sweep(models, plan, args.jobs, args.json)
    print(report(results))
    print(f"\n{len(models)} models in {time.perf_counter() - start:.0f} s")
    return exit_status(results, args.quick, failure is not None)


if __name__ == "__main__":
    sys.exit(main())
