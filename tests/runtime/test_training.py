"""The training loop against eager PyTorch: gradient accumulation, clipping by the global
norm (tied weights counted once), learning-rate schedules, mixed precision and fp16 loss
scaling, and seeds that make dropout independent of the split."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import pipecompile
from pipecompile.errors import ModelFileError, PipecompileError
from pipecompile.runtime.state.precision import LossScaler
from pipecompile.runtime.training.lr_schedule import lr_factor


class Tied(nn.Module):
    """Embedding, two blocks, a head tied to the embedding: a tied weight across stages."""

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.emb = nn.Embedding(32, 16)
        self.l1 = nn.Linear(16, 16)
        self.drop = nn.Dropout(dropout)
        self.l2 = nn.Linear(16, 16)
        self.head = nn.Linear(16, 32, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.l1(self.emb(idx)))
        return self.head(torch.tanh(self.l2(self.drop(x))))


def _loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.reshape(-1, out.size(-1)), target.reshape(-1))


def _batches(count: int, seed: int = 0) -> list[tuple[tuple[torch.Tensor], torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    ids = [torch.randint(0, 32, (8, 6), generator=g) for _ in range(2 * count)]
    return [((ids[2 * k],), ids[2 * k + 1]) for k in range(count)]


def _model(dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(0)
    return Tied(dropout).train()


def _compiled(model: nn.Module, stages: int = 2, **kw):  # type: ignore[no-untyped-def]
    example = _batches(1)[0][0]
    return pipecompile.compile(model, example, stages=stages, microbatches=2, **kw)


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], tol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=tol, rtol=tol, msg=k)


def test_accumulation_equals_one_eager_step_on_the_mean_loss() -> None:
    model = _model()
    eager = copy.deepcopy(model)
    data = _batches(3)
    pipe = _compiled(model)
    records = pipe.fit(data, _loss, lambda ps: torch.optim.SGD(ps, lr=0.5), steps=1,
                       accumulate=3)  # fmt: skip
    opt = torch.optim.SGD(eager.parameters(), lr=0.5)
    loss = sum(_loss(eager(x), y) for (x,), y in data) / 3
    loss.backward()
    opt.step()
    assert records[0]["loss"] == pytest.approx(loss.item(), rel=1e-6)
    _close(pipe.state_dict(), eager.state_dict())


def test_clipping_uses_the_global_norm_counting_a_tied_weight_once() -> None:
    model = _model()
    eager = copy.deepcopy(model)
    (x,), y = _batches(1)[0]
    pipe = _compiled(model, stages=3)
    records = pipe.fit([((x,), y)], _loss, lambda ps: torch.optim.SGD(ps, lr=0.5), steps=1,
                       clip_grad_norm=0.05)  # fmt: skip
    _loss(eager(x), y).backward()
    norm = torch.nn.utils.clip_grad_norm_(eager.parameters(), 0.05)
    torch.optim.SGD(eager.parameters(), lr=0.5).step()
    assert records[0]["grad_norm"] == pytest.approx(float(norm), rel=1e-5)
    assert float(norm) > 0.05  # so the clipping did something
    _close(pipe.state_dict(), eager.state_dict(), 1e-6)


def test_warmup_then_cosine_steps_every_optimizer_once_per_step() -> None:
    pipe = _compiled(_model())
    records = pipe.fit(_batches(2), _loss, "sgd", steps=6, lr=0.1, lr_schedule="cosine",
                       warmup_steps=2)  # fmt: skip
    lrs = [r["lr"] for r in records]  # the rate each step ran with
    factor = lr_factor("cosine", 2, 6)
    assert lrs == pytest.approx([0.1 * factor(s) for s in range(6)])
    assert lrs[:3] == pytest.approx([0.05, 0.1, 0.1]) and lrs[3] < lrs[2]
    for stage_optimizer in pipe.pipeline.optimizers:  # after the last step: 0
        assert stage_optimizer.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)


def test_lr_schedule_needs_a_length_and_a_known_name() -> None:
    with pytest.raises(PipecompileError, match="needs the run's length"):
        lr_factor("cosine", 0, None)
    with pytest.raises(PipecompileError, match="unknown learning-rate schedule 'cosin'"):
        lr_factor("cosin", 0, 10)


def test_bf16_halves_the_traffic_and_follows_eager_autocast() -> None:
    data = _batches(4)
    runs = {}
    for precision in ("fp32", "bf16"):
        pipe = _compiled(_model())
        runs[precision] = pipe.fit(data, _loss, "adamw", steps=4, lr=1e-2, precision=precision)
    eager = _model()
    opt = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    eager_losses = []
    for (x,), y in data:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = _loss(eager(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        eager_losses.append(float(loss))
    bf16 = [r["loss"] for r in runs["bf16"]]
    assert bf16 == pytest.approx(eager_losses, rel=2e-2)
    assert runs["bf16"][0]["sent_bytes"] * 2 == runs["fp32"][0]["sent_bytes"] > 0


def _fp16_steps(pipe, batches, **options):  # type: ignore[no-untyped-def]
    """Two fp16 steps of the training loop itself, here on the CPU, where every door refuses
    fp16 (it needs a GPU): the loss scaling's logic is the same on both."""
    from pipecompile.model.data_hooks import iterable_source
    from pipecompile.options.run import TrainFlags
    from pipecompile.runtime.training.loop import train

    data = iterable_source(batches, pipe.inputs, "batches")
    flags = TrainFlags(steps=2, lr=0.1, optimizer="sgd", precision="fp16", quiet=True, **options)
    return train(pipe.pipeline, _loss, data, flags).records


def test_fp16_overflow_skips_the_step_and_halves_the_scale() -> None:
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pipe = _compiled(model)
    with pytest.raises(PipecompileError, match="--precision fp16 needs a GPU"):  # as `run`
        pipe.fit(_batches(1), _loss, "sgd", steps=2, precision="fp16")
    records = _fp16_steps(pipe, _batches(1), loss_scale=2.0**100)  # overflows fp16 at once
    assert records[0]["skipped"] and records[0]["loss_scale"] == 2.0**99
    assert records[1]["skipped"] and records[1]["loss_scale"] == 2.0**98
    assert math.isfinite(records[0]["loss"])
    _close(pipe.state_dict(), before, 0.0)  # no update was applied
    clean = _fp16_steps(_compiled(_model()), _batches(2))
    assert not any(r["skipped"] for r in clean) and clean[0]["loss_scale"] == 2.0**16


def test_loss_scaler_grows_after_clean_steps() -> None:
    scaler = LossScaler(scale=8.0, interval=2)
    scaler.update(False)
    assert scaler.scale == 8.0
    scaler.update(False)
    assert scaler.scale == 16.0
    scaler.update(True)
    assert scaler.scale == 8.0 and scaler.clean == 0


@pytest.mark.parametrize("kw", [
    {"stages": 1}, {"stages": 3}, {"stages": 2, "schedule": "1f1b"},
    {"stages": 2, "schedule": "zb1p"}, {"stages": 3, "recompute": "always"},
], ids=["1stage", "3stages", "1f1b", "zb1p", "recompute"])  # fmt: skip
def test_a_seed_gives_the_same_dropout_whatever_the_split(kw) -> None:
    data = _batches(2)
    reference = _compiled(_model(0.5), stages=2).fit(data, _loss, "sgd", steps=3, lr=0.5, seed=3)
    stages = kw.pop("stages")
    other = _compiled(_model(0.5), stages=stages, **kw).fit(data, _loss, "sgd", steps=3, lr=0.5,
                                                             seed=3)  # fmt: skip
    a, b = [r["loss"] for r in reference], [r["loss"] for r in other]
    assert b == pytest.approx(a, rel=1e-6, abs=0)
    again = _compiled(_model(0.5), stages=2).fit(data, _loss, "sgd", steps=3, lr=0.5, seed=4)
    assert [r["loss"] for r in again][0] != a[0]  # the seed matters: dropout is on


def test_fit_refuses_what_the_loop_cannot_do() -> None:
    pipe = _compiled(_model())
    with pytest.raises(PipecompileError, match="the norm must be above 0"):
        pipe.fit(_batches(1), _loss, "sgd", clip_grad_norm=0.0)
    with pytest.raises(PipecompileError, match="unknown option"):
        pipe.fit(_batches(1), _loss, "sgd", clip=1.0)
    with pytest.raises(ModelFileError, match="batch 1 is a tuple of 3"):
        pipe.fit([_batches(1)[0], (1, 2, 3)], _loss, "sgd", epochs=1)
    with pytest.raises(ModelFileError, match="an iterator"):
        pipe.fit(iter(_batches(2)), _loss, "sgd")
    untied = nn.Sequential(nn.Embedding(32, 8), nn.Linear(8, 8), nn.Linear(8, 32))
    asynchronous = _compiled(untied, schedule="pipedream")
    with pytest.raises(PipecompileError, match="--clip-grad-norm needs a synchronous"):
        asynchronous.fit(_batches(1), _loss, "sgd", clip_grad_norm=1.0)


def test_epochs_and_eval() -> None:
    pipe = _compiled(_model())
    records = pipe.fit(_batches(3), _loss, "sgd", epochs=2, lr=0.1, eval_batches=_batches(2, 9))
    assert [r["step"] for r in records] == list(range(1, 7))
    assert [r["epoch"] for r in records] == [1, 1, 1, 2, 2, 2]
    assert all(math.isfinite(r["loss"]) and r["samples_per_s"] > 0 for r in records)
    assert records[0]["tokens_per_s"] == pytest.approx(records[0]["samples_per_s"] * 6)


def test_a_batch_that_does_not_split_is_named() -> None:
    pipe = _compiled(_model())
    good = _batches(1)
    odd = ((torch.randint(0, 32, (1, 6)),), torch.randint(0, 32, (1, 6)))  # 1 row, 2 parts
    with pytest.raises(
        PipecompileError, match=r"^fit\(batches\), batch 1 \(step 2\): .*1 row along"
    ):
        pipe.fit([*good, odd], _loss, "sgd", epochs=1)


class _Sized:
    """Batches with a ``__len__`` of ``length`` whose ``__iter__`` yields ``count``."""

    def __init__(self, length: int, count: int) -> None:
        self.length, self.batches = length, _batches(count)

    def __len__(self) -> int:
        return self.length

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.batches)


@pytest.mark.parametrize(("batches", "message"), [
    ([], r"^fit\(batches\) yielded no batches; it must give at least one"),
    (lambda: iter([]), r"^fit\(batches\) yielded no batches"),
    (_Sized(2, 3), r"yielded 3 batches in epoch 1 but its len\(\) is 2; make __len__"),
    (_Sized(5, 3), r"yielded 3 batches in epoch 1 but its len\(\) is 5; make __len__"),
])  # fmt: skip
def test_data_that_gives_other_than_it_promised_stops_the_run(batches, message) -> None:
    pipe = _compiled(_model())
    with pytest.raises(PipecompileError, match=message):
        pipe.fit(batches, _loss, "sgd", steps=8)


def test_a_used_up_iterable_on_a_new_epoch_stops_the_run() -> None:
    """A function that returns the same generator each epoch: 3 of 8 steps, then an error."""
    once = (b for b in _batches(3))
    with pytest.raises(PipecompileError, match=r"yielded no batches in epoch 2 \(epoch 1 gave "
                       r"3\): the iterable was used up.*a function returning a fresh"):  # fmt: skip
        _compiled(_model()).fit(lambda: once, _loss, "sgd", steps=8)
    fresh = _compiled(_model()).fit(lambda: (b for b in _batches(3)), _loss, "sgd", steps=8)
    assert [r["epoch"] for r in fresh] == [1, 1, 1, 2, 2, 2, 3, 3]


def test_nothing_trains_before_eval_batches_pass_a_check_of_their_first_batch() -> None:
    pipe = _compiled(_model())
    before = {k: v.clone() for k, v in pipe.state_dict().items()}
    wrong = [((torch.randint(0, 32, (8, 6)),), torch.randint(0, 32, (8, 5)))]  # targets short
    with pytest.raises(PipecompileError, match=r"^fit\(eval_batches\), batch 0 \(checked "
                       r"before training\): .*loss_fn"):  # fmt: skip
        pipe.fit(_batches(2), _loss, "sgd", epochs=1, eval_batches=wrong)
    with pytest.raises(PipecompileError, match=r"fit\(eval_batches\) yielded no batches"):
        pipe.fit(_batches(2), _loss, "sgd", epochs=1, eval_batches=lambda: iter([]))
    with pytest.raises(PipecompileError, match=r"--eval-every 2: there is no eval_batches\(\)"):
        pipe.fit(_batches(2), _loss, "sgd", epochs=1, eval_every=2)
    _close(pipe.state_dict(), before, tol=0)


def test_an_id_beyond_the_embedding_names_the_batch_the_input_and_the_embedding() -> None:
    bad = ((torch.full((8, 6), 40),), torch.zeros(8, 6, dtype=torch.long))
    with pytest.raises(
        PipecompileError,
        match=r"^fit\(batches\), batch 1 \(step 2\): input "
        r"'idx' holds ids 40..40: beyond embedding 'emb' \(32 rows: ids 0..31\)",
    ):
        _compiled(_model()).fit([*_batches(1), bad], _loss, "sgd", epochs=1)


@pytest.mark.parametrize("loss_fn", [
    lambda out, target: torch.tensor(1.0),
    lambda out, target: _loss(out, target).detach(),
])  # fmt: skip
def test_a_loss_that_cannot_be_differentiated_is_refused(loss_fn) -> None:
    with pytest.raises(
        ModelFileError,
        match=r"^fit\(batches\), batch 0 \(step 1\): .*loss_fn "
        r"\(\S*test_training\.py:\d+\) returned a loss that does not require grad",
    ):
        _compiled(_model()).fit(_batches(1), loss_fn, "sgd", steps=1)


@pytest.mark.parametrize(("optimizer", "options", "message"), [
    (lambda ps: None, {}, "the optimizer factory returned None, not a torch.optim.Optimizer"),
    (lambda ps: torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1), {}, "other parameters"),
    (lambda ps: torch.optim.SGD(ps, lr=-1), {}, "the optimizer factory failed.*ValueError"),
    (lambda ps: torch.optim.SGD(ps, lr=0.1), {"lr": 0.5}, r"fit\(lr=0.5\).*factory sets its own"),
    # as `run --optimizer sgdd` and `run --lr 0` are refused (the same declarations)
    ("sgdd", {}, r"argument --optimizer: invalid choice: 'sgdd' \(choose from 'adam'"),
    ("sgd", {"lr": 0.0}, "argument --lr: '0.0' is not a finite number above 0"),
    ("sgd", {"loss_scale": 1024.0}, "loss_scale 1024 is the initial scale of --precision fp16"),
])  # fmt: skip
def test_an_optimizer_that_would_train_nothing_is_refused(optimizer, options, message) -> None:
    pipe = _compiled(_model())
    with pytest.raises(PipecompileError, match=message):
        pipe.fit(_batches(1), _loss, optimizer, steps=1, **options)
    if callable(optimizer) and not options:
        with pytest.raises(PipecompileError, match=message):
            pipe.train_step(*_batches(1)[0], _loss, optimizer)


def test_progress_bar_on_a_terminal_and_lines_otherwise(tmp_path) -> None:
    import io

    from pipecompile.runtime.training.metrics import Reporter
    from pipecompile.runtime.training.records import StepRecord

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    record = StepRecord(step=2, epoch=1, loss=1.5, step_ms=10.0, samples_per_s=80.0, bubble=0.25)
    bar, lines = Terminal(), io.StringIO()
    Reporter(tmp_path / "m.jsonl", 4, stream=bar).step(record)
    Reporter(None, 4, stream=lines).step(record)
    assert bar.getvalue().startswith("\r[############............] 2/4  loss 1.5000")
    assert "ETA 0:00:0" in bar.getvalue()
    assert lines.getvalue() == "step 2/4  loss 1.500000  (10.0 ms)  80.0 samples/s  bubble 25%\n"
    assert '"kind": "train"' in (tmp_path / "m.jsonl").read_text()


def test_a_step_record_writes_the_keys_in_the_files_order_and_reads_as_a_mapping() -> None:
    from pipecompile.runtime.training.records import EvalRecord, StepRecord

    record = StepRecord(step=3, epoch=1, loss=0.5, lr=1e-3, peak_memory=[10, 20], first=2)
    assert list(record.to_json()) == [
        "kind", "step", "epoch", "loss", "lr", "step_ms", "samples_per_s", "tokens_per_s",
        "bubble", "peak_memory", "sent_bytes", "grad_norm", "loss_scale", "skipped", "first",
        "optimizer_state_bytes",
    ]  # fmt: skip
    assert record["loss"] == record.loss == 0.5 and record["kind"] == "train"
    with pytest.raises(KeyError):
        record["losses"]
    assert EvalRecord(4, 1, 0.25).to_json() == {"kind": "eval", "step": 4, "epoch": 1, "loss": 0.25}
