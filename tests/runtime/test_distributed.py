"""Multi-process runs on torch.distributed (gloo, CPU): equal to the local backend and to
eager, tied weights, faults that never hang, checkpoints that lose nothing."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pipecompile.runtime.distributed.launch import launch
from pipecompile.runtime.job.placement import Placement
from pipecompile.runtime.job.run import RunJob
from pipecompile.runtime.training.model_keyed import read_model_keyed
from pipecompile.schedules import LOOPED, V_SHAPED
from pipecompile.surfaces.cli import main
from tests.conftest import EXAMPLES, SAMPLED_OUT

MLP, GPT = str(EXAMPLES / "mlp.py"), str(EXAMPLES / "gpt.py")
TOWERS = str(EXAMPLES / "two_towers.py")


def compile_to(tmp_path: Path, model: str, *options: str) -> str:
    out = str(tmp_path / "out")
    assert main([model, "-q", "-o", out, *options]) == 0
    return out


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):  # type: ignore[no-untyped-def]
    """compiled(model, *options): the emitted directory, compiled once for every test here that
    only runs it (a run adds its metrics.jsonl there; checkpoints go elsewhere)."""
    made: dict[tuple[str, ...], str] = {}

    def get(model: str, *options: str) -> str:
        if (model, *options) not in made:
            made[(model, *options)] = compile_to(tmp_path_factory.mktemp("out"), model, *options)
        return made[(model, *options)]

    return get


MLP_2 = ("--stages", "2", "--microbatches", "4", "--schedule", "gpipe")
# Two stages per rank: zbv's V also passes a value between them without a message, and
# dualpipev pairs whole backwards with forwards; the others are sampled out for time
# (tools/bench/shapes.py checks every V on 2 ranks, and zbv's placement is v_half's)
PLACED_KEPT = ("zbv", "dualpipev")
PLACED_NAMES = [*LOOPED, *V_SHAPED]
PLACED_CASES = [
    pytest.param(
        GPT,
        2,
        ["--stages", "4", "--microbatches", "4", "--schedule", name],
        marks=() if name in PLACED_KEPT else SAMPLED_OUT,
    )
    for name in PLACED_NAMES
]
PLACED_IDS = [f"gpt-{name}-2" for name in PLACED_NAMES]
GPT_4 = ("--stages", "4", "--microbatches", "4", "--schedule", "1f1b")


@pytest.mark.parametrize(
    "model, nproc, options",
    [
        # sampled out for time: gpipe on 2 ranks runs in the data, restart and mesh tests
        pytest.param(MLP, 2, ["--stages", "2", "--microbatches", "4", "--schedule", "gpipe"],
                     marks=SAMPLED_OUT),
        # a stage graph: the towers side by side, the batch handed on by an input stage,
        # messages between stages that are not neighbours, zb1p's split backward; sampled out
        # for time: test_whole_loss.py checks examples/clip.py's stage graph on 2 ranks
        pytest.param(TOWERS, 2, ["--stages", "2", "--microbatches", "4", "--schedule", "zb1p",
                                 "--graph"], marks=SAMPLED_OUT),
        # zb2p: zb1p's F, I and W (and their messages), more micro-batches in flight
        (MLP, 2, ["--stages", "2", "--microbatches", "4", "--schedule", "zb2p",
                  "--checkpoint", "always"]),
        (MLP, 2, ["--stages", "2", "--microbatches", "4", "--schedule", "pipedream"]),
        # 4 ranks, the slowest; test_mesh.py trains 1f1b on 4 ranks against the local backend
        pytest.param(GPT, 4, ["--stages", "4", "--microbatches", "4", "--schedule", "1f1b"],
                     marks=SAMPLED_OUT),
        # two stages per rank, every looped and V-shaped schedule of the registry (below)
        *PLACED_CASES,
        # the balancer chooses the replicas: [1, 2] (the lm_head stage is the heavier one);
        # sampled out for time: test_replicated_stages_equal_the_unreplicated_run runs both
        # replica layouts under --nproc
        pytest.param(GPT, 3, ["--stages", "2", "--microbatches", "4", "--workers", "3"],
                     marks=SAMPLED_OUT),
    ],
    ids=["mlp-gpipe-2", "towers-graph-zb1p-2", "mlp-zb2p-ckpt-2", "mlp-pipedream-2", "gpt-1f1b-4",
         *PLACED_IDS, "gpt-workers-3"],
)  # fmt: skip
def test_distributed_check_equals_local_and_eager(compiled, capfd, model, nproc, options):
    out = compiled(model, *options)
    assert main(["run", out, "--nproc", str(nproc), "--check", "--lr", "0.1"]) == 0
    text = capfd.readouterr().out
    assert "check passed" in text
    assert f"distributed ({nproc} ranks) vs local backend" in text
    if "--workers" not in options:  # replicas add their gradients in another order
        assert "max |diff| 0.000e+00" in text.split("vs local backend")[1]


def test_wrong_process_count_is_a_clear_error(compiled, capfd):
    """Refused before any rank starts; a rank started another way (torchrun) refuses too."""
    out = compiled(MLP, *MLP_2)
    assert main(["run", out, "--nproc", "3", "-q"]) == 2
    err = capfd.readouterr().err
    assert (
        "--nproc 3: the program runs on 2 devices with replicas [1, 1], 2 ranks; run --nproc 2"
        in err
    )
    assert "rank" not in err.split("ranks;")[1]  # no rank was started to say so


def launch_job(nproc: int, argv: list[str], **keywords: object) -> int:
    """``launch`` the job of ``argv`` (a rank's command line) on ``nproc`` ranks."""
    return launch(RunJob.from_argv(argv, nproc=nproc), **keywords)  # type: ignore[arg-type]


# kill: tests/runtime/test_mesh.py kills a rank of a 4-rank mesh the same way
@pytest.mark.parametrize("kind", [pytest.param("kill", marks=SAMPLED_OUT), "raise"])
def test_a_failed_rank_stops_every_rank_naming_it(compiled, capfd, monkeypatch, kind):
    out = compiled(GPT, *GPT_4)
    monkeypatch.setenv("PIPECOMPILE_FAULT", f"2:2B1:{kind}")
    records: list[dict] = []
    start = time.time()
    status = launch_job(4, [out, "--steps", "3", "--timeout", "300", "-q"], keep=records)
    assert status == 2
    err = capfd.readouterr().err
    culprit = "rank 2 died" if kind == "kill" else "rank 2 failed at instruction 2B1"
    for rank in (0, 1, 3):
        line = next(ln for ln in err.splitlines() if ln.startswith(f"pipecompile: rank {rank}:"))
        assert culprit in line and "2B1" in line, err
    by_rank = {r["rank"]: r for r in records}
    assert {by_rank[r]["status"] for r in (0, 1, 3)} == {3}
    failed_at = by_rank[2]["time"]
    assert all(by_rank[r]["time"] - failed_at < 120 for r in (0, 1, 3))  # well inside --timeout
    assert time.time() - start < 240  # generous: a hang guard, not a speed test


@SAMPLED_OUT  # tests/runtime/test_mesh.py resumes under --nproc (at another scale, too)
def test_resume_reproduces_the_uninterrupted_run(tmp_path, compiled):
    straight, split = tmp_path / "straight", tmp_path / "split"
    args = ["--nproc", "2", "--optimizer", "adamw", "--lr", "0.01", "-q"]
    interleave = compiled(GPT, "--stages", "4", "--microbatches", "4", "--schedule", "interleaved")
    assert main(["run", interleave, "--steps", "4", "--save", str(straight), "--save-every", "2",
                 *args]) == 0  # fmt: skip
    # the run as if stopped after step 2's save: its checkpoints up to step 2, `latest` naming it
    shutil.copytree(straight, split, ignore=shutil.ignore_patterns("step_4"))
    (split / "latest").write_text("step_2\n")
    assert main(["run", interleave, "--steps", "4", "--resume", str(split),
                 "--save", str(split), *args]) == 0  # fmt: skip
    a = read_model_keyed(straight / "step_4")
    b = read_model_keyed(split / "step_4")
    assert a.keys() == b.keys() and any(k.startswith("optim.") for k in a)
    differ = [k for k in a if isinstance(a[k], torch.Tensor) and not torch.equal(a[k], b[k])]
    assert not differ, f"{differ[:3]} differ after resuming"
    # the tied embedding (stage 0 on rank 0, stage 3 on rank 1) is one entry
    assert "model.lm_head.weight" in a and "model.wte.weight" not in a
    exported = tmp_path / "weights.safetensors"
    assert main(["export", interleave, "--checkpoint", str(straight), "-o", str(exported)]) == 0
    from tests.conftest import example_spec

    model, fresh = example_spec("gpt").model, example_spec("gpt").model
    model.load_state_dict(load_file(exported))
    assert torch.equal(model.wte.weight, model.lm_head.weight)
    assert not torch.equal(model.wte.weight, fresh.wte.weight)  # the trained weights


def test_a_hung_rank_is_stopped_after_the_timeout(compiled, capfd, monkeypatch):
    out = compiled(MLP, *MLP_2)
    monkeypatch.setenv("PIPECOMPILE_FAULT", "1:1B2:hang")
    start = time.time()
    assert launch_job(2, [out, "--steps", "2", "--timeout", "3", "-q"]) == 2
    assert time.time() - start < 120  # generous: a hang guard, not a speed test
    err = capfd.readouterr().err
    assert "pipecompile: rank 1: stopping at instruction 1B2: no progress for 3 s" in err, err


def test_messages_posted_on_the_main_thread_train_alike(compiled, capfd, monkeypatch):
    """PIPECOMPILE_POST_THREAD=0 posts sends and receives on the main thread (the way NCCL
    always posts): the same losses, bit for bit, as the helper thread's."""
    out = compiled(GPT, "--stages", "2", "--microbatches", "4")
    train = ["--steps", "2", "--optimizer", "sgd", "--lr", "0.1"]
    losses = []
    for way in ("1", "0"):
        monkeypatch.setenv("PIPECOMPILE_POST_THREAD", way)
        assert main(["run", out, "--nproc", "2", *train]) == 0
        losses.append([ln.split()[3] for ln in capfd.readouterr().out.splitlines()])
    assert len(losses[0]) == 2 and losses[0] == losses[1]


def test_a_distributed_mismatch_exits_1(tmp_path, capfd):
    out = compile_to(tmp_path, GPT, "--stages", "2", "--microbatches", "4")
    assert main(["run", out, "--nproc", "2", "--check", "--atol", "0", "--rtol", "0"]) == 1
    assert "check FAILED" in capfd.readouterr().out


@pytest.mark.parametrize(
    "model, stages, replicate, nproc",
    [
        # 4 ranks on 2 cores, the slowest; the GPT cases replicate a first and a last stage
        pytest.param(MLP, 3, "2,1,1", 4, marks=SAMPLED_OUT),
        (GPT, 2, "2,1", 3),
        pytest.param(GPT, 2, "1,2", 3, marks=SAMPLED_OUT),  # a replicated last stage
    ],
    ids=["mlp-2-1-1", "gpt-tied-2-1", "gpt-last-1-2"],
)
def test_replicated_stages_equal_the_unreplicated_run(
    tmp_path, compiled, capfd, model, stages, replicate, nproc
):
    common = ["--stages", str(stages), "--microbatches", "4", "--schedule", "1f1b"]
    out = compile_to(tmp_path, model, *common, "--replicate", replicate)
    program = (Path(out) / "program.txt").read_text()
    replicated = [j for j, r in enumerate(replicate.split(",")) if r != "1"]
    assert all(f"{j}ALLREDUCE_REPLICAS" in program for j in replicated)
    assert main(["run", out, "--nproc", str(nproc), "--check"]) == 0
    assert "check passed" in capfd.readouterr().out
    train = ["--steps", "3", "--optimizer", "sgd", "--lr", "0.1"]
    trace = tmp_path / "trace.json"
    traced = ["--trace", str(trace), "--trace-steps", "1"]
    assert main(["run", out, "--nproc", str(nproc), *train, *traced]) == 0
    replicated = [float(ln.split()[3]) for ln in capfd.readouterr().out.splitlines()]
    # each forward ran on the rank the plan search prices it on: replica k of a stage with r
    # replicas runs the micro-batches i with i mod r == k (so the busiest ceil(m / r))
    counts = [int(r) for r in replicate.split(",")]
    place = Placement(tuple(range(stages)), tuple(counts))
    ran = {
        (e["args"]["stage"], e["args"]["microbatch"]): int(e["pid"])
        for e in json.loads(trace.read_text())["traceEvents"]
        if e.get("ph") == "X"
        and e["name"] == f"{e.get('args', {}).get('stage')}F{e.get('args', {}).get('microbatch')}"
        and int(e["pid"]) < nproc
    }
    assert ran == {(j, i): place.rank_of(j, i) for j in range(stages) for i in range(4)}
    # the unreplicated reference runs locally: an unreplicated run under --nproc equals the
    # local one bit for bit (test_distributed_check_equals_local_and_eager)
    plain = compiled(model, *common)  # gpt-tied-2-1 and gpt-last-1-2 share it
    assert main(["run", plain, *train]) == 0
    unreplicated = [float(ln.split()[3]) for ln in capfd.readouterr().out.splitlines()]
    assert len(replicated) == len(unreplicated) == 3
    assert replicated == pytest.approx(unreplicated, abs=1e-5)


@pytest.mark.parametrize(
    "options, message",
    [
        (["--stages", "3", "--replicate", "2,1"], "one replica count of at least 1 per stage"),
        (["--stages", "4", "--microbatches", "4", "--schedule", "interleaved",
          "--replicate", "2,1,1,1"], "one stage per device"),
        (["--stages", "2", "--schedule", "pipedream", "--replicate", "2,1"],
         "need a synchronous schedule"),
        (["--stages", "2", "--microbatches", "2", "--replicate", "3,1"],
         "gives stage 0 3 replicas but the step has 2 micro-batches: replica k runs the "
         "micro-batches i with i mod 3 == k, so 1 of them would have none"),
    ],
)  # fmt: skip
def test_replication_errors(tmp_path, capfd, options, message):
    assert main([MLP, "-q", "-o", str(tmp_path / "o"), *options]) == 2
    assert message in capfd.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_nccl_on_two_gpus_equals_local(tmp_path, capfd):
    out = compile_to(tmp_path, GPT, "--stages", "2", "--microbatches", "4", "--schedule", "1f1b")
    assert main(["run", out, "--nproc", "2", "--device", "cuda", "--check",
                 "--atol", "1e-4", "--rtol", "1e-4"]) == 0  # fmt: skip
    assert "check passed" in capfd.readouterr().out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_two_stages_on_one_gpu_train_and_check(tmp_path, capfd, precision):
    """Both stages of an interleaved program on one GPU, one NCCL rank: fp32 checks equal to
    the eager model on the CPU (by the noise-floor rule); bf16 and fp16 train finite losses."""
    import json

    out = compile_to(tmp_path, GPT, "--stages", "2", "--schedule", "interleaved",
                     "--virtual-stages", "2", "--microbatches", "4")  # fmt: skip
    if precision == "fp32":
        assert main(["run", out, "--nproc", "1", "--device", "cuda", "--check"]) == 0
        assert "check passed" in capfd.readouterr().out
        return
    assert main(["run", out, "--nproc", "1", "--device", "cuda", "--steps", "3",
                 "--precision", precision, "-q"]) == 0  # fmt: skip
    records = [json.loads(line) for line in Path(out, "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    assert len(losses) == 3 and all(0 < loss < 10 for loss in losses), losses


def test_a_full_disk_stops_every_rank_naming_the_path(tmp_path, capfd):
    """A save the disk refuses mid-run: every rank stops (none waits on a barrier the failed
    one never reaches), the error names the directory, and `latest` names a whole step."""
    import subprocess

    full = tmp_path / "full"
    full.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=320k", "tmpfs", str(full)],
                             capture_output=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        out = compile_to(tmp_path, MLP, "--stages", "2", "--microbatches", "2")
        ck = full / "ck"
        argv = ["run", out, "--nproc", "2", "--steps", "20", "--save", str(ck), "--save-every",
                "1", "--timeout", "120", "-q"]  # fmt: skip
        assert main(argv) == 2
        err = capfd.readouterr().err
        assert "cannot write train state step_" in err and f"to {ck}: the disk is full" in err
        assert "Traceback" not in err
        assert all(line.startswith("pipecompile: rank") for line in err.strip().splitlines())
        assert (
            f"the last complete saved step there is {ck / (ck / 'latest').read_text().strip()}"
            in err
        )
        assert not list(ck.glob(".step_*"))
    finally:
        subprocess.run(["umount", "-l", str(full)], capture_output=True)
