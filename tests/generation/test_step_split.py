"""The traced decoding step split at block boundaries (``generation.step_split``): for every
split of a small Llama into 2 and 4 stages, of a Mixtral (a mixture of experts, its router
in the step) into 2, and three 2-stage splits of a 12-layer GPT-2 (the head a stage of
its own among them), the stages run one after another compute what the
unsplit step does, to the bit, and write the same caches; a stage hands on tensors only (the
sizes a later block reads are read off its own inputs: export reads the rows of a 12-layer
GPT-2's decode off a middle layer's cache); and ops that read only positions, the mask and
buffers are computed where read, never sent."""

from __future__ import annotations

import itertools

import pytest
import torch

from pipecompile.generation.plan import block_list
from pipecompile.generation.step_split import split_step
from pipecompile.generation.step_trace import StepCall, causal_mask, layer_shapes, trace_step
from tests.generation.conftest import VOCAB, tiny_decoder

ROWS, LENGTH = 16, 24


def _bounds(layers: int, stages: int):  # every split of the blocks and the head into stages
    if layers == 12:  # the 12-layer GPT-2: around layer 7, whose cache export reads rows off
        yield from (((0, 6), (6, 12)), ((0, 8), (8, 12)), ((0, 12), (12, 12)))
        return
    for cuts in itertools.combinations(range(1, layers + 1), stages - 1):
        edges = [0, *cuts, layers + 1]
        yield tuple((min(a, layers), min(b, layers)) for a, b in zip(edges, edges[1:]))


def _gpt2_12() -> torch.nn.Module:
    import transformers as tf

    torch.manual_seed(0)
    config = tf.GPT2Config(n_layer=12, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=64,
                           bos_token_id=0, eos_token_id=None)  # fmt: skip
    return tf.GPT2LMHeadModel(config).eval()


@pytest.mark.parametrize(
    ("family", "counts"), [("gpt2", (2,)), ("llama", (2, 4)), ("mixtral", (2,))]
)
def test_every_split_computes_the_unsplit_step(family, counts):
    model = _gpt2_12() if family == "gpt2" else tiny_decoder(family)
    call = StepCall.of(model)
    path, blocks = block_list(model)
    shapes = layer_shapes(model, call, len(blocks))
    names = set(model.state_dict())
    traced = trace_step(model, call, shapes, kind="decode", rows=ROWS, max_length=LENGTH)
    g = torch.Generator().manual_seed(0)
    rows = 5  # fewer than the cache's rows: the size is the call's
    ids = torch.randint(0, VOCAB, (rows, 1), generator=g)
    positions = torch.randint(0, LENGTH, (rows, 1), generator=g)
    mask = causal_mask(positions, LENGTH, torch.float32)
    cache = [torch.randn(rows, h, LENGTH, d, generator=g) for h, d in shapes for _ in (0, 1)]
    whole_cache = [t.clone() for t in cache]
    with torch.no_grad():
        want = traced(ids, positions, mask, whole_cache)
    for stages in counts:
        for bounds in _bounds(len(blocks), stages):
            split = split_step(
                traced, prefix=f"model.{path}.", bounds=bounds, model_names=names, kind="decode"
            )
            mine = [t.clone() for t in cache]
            xs: tuple = (ids,)
            with torch.no_grad():
                for stage in split:
                    kv = [mine[2 * i + j] for i in stage.layers for j in (0, 1)]
                    out = stage.module(*xs, positions, mask, *kv)
                    xs = out if isinstance(out, tuple) else (out,)
                    assert all(isinstance(x, torch.Tensor) for x in xs), (bounds, stage.outputs)
            assert torch.equal(xs[0], want), bounds
            assert all(torch.equal(a, b) for a, b in zip(mine, whole_cache)), bounds
            for stage in split[1:]:  # only what a block makes crosses; positions never do
                assert all(not n.startswith(("sym_size", "cos", "sin")) for n in stage.inputs)
