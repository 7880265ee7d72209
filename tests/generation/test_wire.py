"""The generation ranks' wire: torch.distributed point-to-point messages in a gloo group of its
own. Two ranks (threads of this process, a store of their own) pass lists of tensors of every
dtype and shape, empty ones and a header longer than its first part among them, around the
ring unchanged and in order; a receive that waits past its timeout says so."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed as dist

from pipecompile.errors import RuntimeFailure
from pipecompile.generation.wire import connect


def _pair(timeout: float | None = None):  # -> (wire of rank 0, wire of rank 1)
    store = dist.TCPStore("127.0.0.1", 0, 2, True, wait_for_workers=False)
    wires: dict[int, object] = {}

    def join(rank: int) -> None:  # each rank a store client of its own, as a process has
        mine = store if rank == 0 else dist.TCPStore("127.0.0.1", store.port, 2, False)
        wires[rank] = connect(mine, rank, 2, timeout=timeout)

    threads = [threading.Thread(target=join, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return wires[0], wires[1]


def _messages() -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    many = [torch.randn(2, 3, generator=g) for _ in range(90)]  # a header of 451 numbers
    return [
        [torch.tensor([1, 2, 3])],
        [torch.randn(4, 5, generator=g).to(dtype) for dtype in
         (torch.float32, torch.bfloat16, torch.float16, torch.float64)],
        [torch.empty(0, 7), torch.tensor(5), torch.zeros(1, 1, 1, dtype=torch.int64)],
        many,
        [],
    ]  # fmt: skip


def test_messages_go_round_unchanged_and_in_order():
    zero, one = _pair()
    sent = _messages()
    for message in sent:
        zero.send(message)
    for _ in sent:  # rank 1 passes each on to rank 0, the ring's back edge
        one.send(one.recv())
    for want in sent:
        got = zero.recv()
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    assert not zero.ready()


def test_a_receive_waits_no_longer_than_its_timeout():
    zero, _ = _pair(timeout=0.3)
    with pytest.raises(RuntimeFailure, match=r"nothing came back from the last stage for 0\.3 s"):
        zero.recv()


class _Counted:
    """A process group that counts the tensors it sends."""

    def __init__(self, group) -> None:
        self.group, self.sent = group, 0

    def send(self, tensors, peer, tag):
        self.sent += 1
        return self.group.send(tensors, peer, tag)

    def recv(self, tensors, peer, tag):
        return self.group.recv(tensors, peer, tag)


def test_tensors_on_a_device_take_the_fast_group_and_the_rest_gloo(monkeypatch):
    """The device ends' routing, with a gloo group standing in for NCCL and float32 standing
    in for "on a GPU": each such tensor (not an empty one) goes by the fast group, in its
    place among the message's others, on both links of the ring."""
    import pipecompile.generation.wire as wire_module

    monkeypatch.setattr(wire_module, "on_device", lambda t: t.dtype == torch.float32)
    zero, one = _pair(timeout=60.0)  # a message lost between the groups fails, not hangs
    store = dist.TCPStore("127.0.0.1", 0, 2, True, wait_for_workers=False)
    groups: dict[int, object] = {}

    def join(rank: int) -> None:
        mine = store if rank == 0 else dist.TCPStore("127.0.0.1", store.port, 2, False)
        groups[rank] = _Counted(dist.ProcessGroupGloo(mine, rank, 2))

    threads = [threading.Thread(target=join, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for wire, rank in ((zero, 0), (one, 1)):
        wire.fast = wire_module.Fast(groups[rank], torch.device("cpu"), out=True, into=True)
    sent = _messages()
    for message in sent:
        zero.send(message)
    for _ in sent:
        one.send(one.recv())
    for want in sent:
        got = zero.recv()
        assert [(a.dtype, a.shape) for a in got] == [(b.dtype, b.shape) for b in want]
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    floats = sum(t.dtype == torch.float32 and t.numel() > 0 for m in sent for t in m)
    assert floats > 90 and groups[0].sent == floats and groups[1].sent == floats
