"""Recurrent modules keep their weights twice (``_flat_weights``); a functional call that
swaps them in and out must leave both copies the module's own: compiling a model with an
LSTM leaves the user's model computing with its own weights, and its stage file is written."""

import torch
from torch import nn

from pipecompile.ir.graph.swapped_call import functional_call


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(6, 8)
        self.rnn = nn.LSTM(8, 5, batch_first=True, bidirectional=True)
        self.head = nn.Linear(10, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(x))
        return self.head(out)


def _own(rnn: nn.RNNBase) -> bool:
    return all(w is getattr(rnn, n) for w, n in zip(rnn._flat_weights, rnn._flat_weights_names))


def test_a_functional_call_leaves_the_flat_weights_the_modules_own():
    rnn = nn.GRU(4, 3, num_layers=2)
    x = torch.randn(5, 2, 4)
    doubled = {k: v.detach() * 2 for k, v in rnn.state_dict().items()}
    swapped, _ = functional_call(rnn, doubled, (x,))
    assert _own(rnn)
    again, _ = torch.func.functional_call(rnn, doubled, (x,))
    assert torch.equal(swapped, again)  # the call itself computes with the swapped tensors
    assert not _own(rnn)  # what torch leaves behind, and this module repairs


def test_compiling_a_model_with_an_lstm_leaves_it_computing_with_its_own_weights(
    tmp_path, monkeypatch
):
    import pipecompile

    monkeypatch.setenv("PIPECOMPILE_VERIFY", "on")  # the proof's functional call too
    torch.manual_seed(0)
    model = Tagger()
    x = torch.randn(4, 7, 6)
    before = model(x).detach()
    pipecompile.compile(model, (x,), stages=2, microbatches=2, directory=tmp_path / "out")
    assert _own(model.rnn)
    assert torch.equal(model(x), before)
    assert (
        "torch.nn.LSTM("
        in (tmp_path / "out" / "stage_0.py").read_text()
        + (tmp_path / "out" / "stage_1.py").read_text()
    )
