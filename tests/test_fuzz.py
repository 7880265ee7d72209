"""Random models from tools/qa/fuzz.py go through the whole tool: each one matches eager or is
refused with a clear error, never an internal error or a mismatch.

A fixed set of seeds, chosen so that together they use every feature of the generator and
every schedule with every checkpoint policy, runs in this process; two of them also run with
``pipecompile run --nproc N --check``. Replay a failing seed with ``python tools/qa/fuzz.py
--seed SEED --show``. The tool's own ``--quick`` run, as a user runs it, is
tests/tools/test_quick.py's (it exits 1 on any internal, mismatch or invalid model).
"""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT, SAMPLED_OUT, load_tool

TOOL = ROOT / "tools" / "qa" / "fuzz.py"


fuzz = load_tool(TOOL)

# 18 seeds: a smallest cover (greedy) of the generator's features over seeds 2000-2399, the
# 15 schedule x checkpoint-policy pairs, 1-4 stages and 1, 2 and 4 micro-batches, which
# test_the_seeds_cover_every_feature_schedule_and_policy checks (it was 63 seeds; the other 45
# added nothing to cover). The whole range runs in `python tools/qa/fuzz.py --count 1000
# --seed 2000 --jobs 2`.
SEEDS = [2024, 2065, 2083, 2088, 2111, 2133, 2153, 2222, 2234, 2335, 2357, 2359, 2517, 2622,
         2673, 2676, 2746, 2981]  # fmt: skip
# interleaved on 2 ranks; zb1p with BatchNorm, a counter, in-place (sampled out for time)
DISTRIBUTED = [2183, pytest.param(2250, marks=SAMPLED_OUT)]
# Seeds failing for a known cause being fixed elsewhere: {seed: reason} (xfail, not strict).
# None today: in-place ops at stage boundaries and weights forward never reads are fixed.
KNOWN_FAILURES: dict[int, str] = {}


def _explain(outcome) -> str:  # type: ignore[no-untyped-def]
    return (
        f"seed {outcome.seed}: {outcome.verdict} [{outcome.phase}] {outcome.key}\n"
        f"config: {outcome.config}\n{outcome.source}\n{outcome.detail}\n"
        f"replay: python tools/qa/fuzz.py --seed {outcome.seed} --show"
    )


def _params(seeds: list[int]) -> list[object]:
    return [
        pytest.param(s, marks=pytest.mark.xfail(reason=KNOWN_FAILURES[s], strict=False))
        if s in KNOWN_FAILURES
        else s
        for s in seeds
    ]


@pytest.mark.parametrize("seed", _params(SEEDS + sorted(KNOWN_FAILURES)))
def test_random_model_matches_eager_or_is_refused(seed, tmp_path):
    outcome = fuzz.run_case(seed, workdir=tmp_path)
    assert outcome.verdict in ("matched", "refused"), _explain(outcome)


@pytest.mark.parametrize("seed", DISTRIBUTED)
def test_random_model_distributed_check(seed, tmp_path):
    outcome = fuzz.run_case(seed, distributed=True, workdir=tmp_path)
    assert outcome.verdict == "matched" and outcome.distributed == "matched", _explain(outcome)


def test_the_seeds_cover_every_feature_schedule_and_policy():
    cases = [fuzz.generate(s) for s in SEEDS + sorted(KNOWN_FAILURES)]
    features = {f for c in cases for f in c.features}
    everything = {f for s in range(2000, 2400) for f in fuzz.generate(s).features}
    assert everything <= features, sorted(everything - features)
    pairs = {(c.config.schedule, c.config.recompute) for c in cases}
    assert len(pairs) == len(fuzz.SCHEDULES) * len(fuzz.POLICIES)
    assert {c.config.stages for c in cases} == {1, 2, 3, 4}
    assert {c.config.microbatches for c in cases} == {1, 2, 4}


def test_generated_models_run_eagerly(tmp_path):
    """The generator's own promise: every model runs forward and backward (no compile)."""
    from pipecompile.model.model_file import load_model_file

    for seed in range(300):
        for inplace in (True, False):
            path = tmp_path / f"model_{seed}_{inplace}.py"
            path.write_text(fuzz.generate(seed, inplace=inplace).source)
            fuzz.eager_step(load_model_file(str(path)))


def test_no_inplace_generates_no_inplace_op():
    writes = re.compile(r"[a-z]_\(|inplace=True|\+=|\] =")

    def forward(source: str) -> str:  # without the buffer updates, which stay
        body = source[source.index("def forward", source.index("class Fuzz")) :]
        body = body[: body.index("def build_model")]
        return "\n".join(line for line in body.splitlines() if "self.stat" not in line)

    for seed in range(200):
        case = fuzz.generate(seed, inplace=False)
        assert not any(f.startswith("in-place") for f in case.features), seed
        assert not writes.search(forward(case.source)), (seed, forward(case.source))
    assert any(writes.search(forward(fuzz.generate(s).source)) for s in range(20))


def test_same_seed_same_model():
    assert fuzz.generate(7).source == fuzz.generate(7).source
    assert fuzz.generate(7).source != fuzz.generate(8).source


def test_failures_are_classified_by_reason():
    outcome = fuzz.Outcome(1, "matched")
    try:
        raise fuzz_error("cannot cut Fuzz into 3 stages: it has 2 ops")
    except Exception as err:
        fuzz.classify(outcome, "refused", "compile", err)
    assert outcome.key == "BalanceError: cannot cut Fuzz into N stages: it has N ops"
    counts = fuzz.summary([outcome, fuzz.Outcome(2, "matched")])
    assert re.search(r"matched +1\n  refused +1\n", counts), counts


def fuzz_error(message: str) -> Exception:
    from pipecompile.errors import BalanceError

    return BalanceError(message)


# The peer, torch.distributed.pipelining (tools/qa/fuzzing/peer.py): seed 4 (inputs as a tuple,
# a dict output), 25 (BatchNorm2d, a running mean buffer) and 10046 (an embedding called in two
# stages, ``emb0`` and ``emb0@1``, and a constant lifted to a buffer) split into 3, 4 and 3
# stages as asked and match; seed 3 has a torch.no_grad() region, which pipeline() refuses.
PEER_SEEDS = {4: ("matched", 3), 25: ("matched", 4), 10046: ("matched", 3), 3: ("refused", 0)}


@pytest.fixture(scope="module")
def peer_outcomes(tmp_path_factory):  # type: ignore[no-untyped-def]
    workdir = tmp_path_factory.mktemp("peer")
    return {seed: fuzz.run_peer(fuzz.generate(seed), workdir) for seed in PEER_SEEDS}


@pytest.mark.parametrize("seed", sorted(PEER_SEEDS))
def test_peer_outcome(seed, peer_outcomes):
    peer = peer_outcomes[seed]
    assert peer.verdict in fuzz.VERDICTS, peer
    verdict, stages = PEER_SEEDS[seed]
    assert (peer.verdict, peer.stages) == (verdict, stages), f"{peer.key}\n{peer.detail}"
    assert peer.wanted == fuzz.generate(seed).config.stages
    if verdict == "refused":
        assert peer.key.startswith("RuntimeError: "), peer.key


def test_peer_summary_block(peer_outcomes):
    outcomes = [fuzz.Outcome(s, "matched", peer=p) for s, p in sorted(peer_outcomes.items())]
    text = fuzz.summary(outcomes)
    block = text[text.index(fuzz.PEER) :]
    assert re.search(r"^  matched +3\n  refused +1\n", block, re.M), text
    assert "stages as asked: 3 of 3 split models" in block, text
    assert fuzz.PEER not in fuzz.summary([fuzz.Outcome(1, "matched")])
