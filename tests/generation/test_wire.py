"""The ranks' wire carries tensors of every dtype and shape it is given, whole, and says when
the other end went away instead of waiting for it."""

from __future__ import annotations

import socket

import pytest
import torch

from pipecompile.errors import RuntimeFailure
from pipecompile.generation.wire import PeerGone, Wire


def _pair(**kw):  # type: ignore[no-untyped-def]
    a, b = socket.socketpair()
    return Wire(b, a, **kw), a, b  # receives on b what is sent on a


def test_tensors_of_every_kind_arrive_whole():
    wire, a, b = _pair()
    g = torch.Generator().manual_seed(0)
    sent = [
        torch.tensor(7),  # no dimensions
        torch.empty(0, 3),  # no elements
        torch.randn(2, 3, 5, generator=g).to(torch.bfloat16),
        torch.randn(4, 1, generator=g).half(),
        torch.randn(3, generator=g, dtype=torch.float64),
        torch.arange(12).view(3, 4).t(),  # not contiguous
        torch.randn(64, 129, generator=g),  # bigger than one read
    ]
    wire.send(sent)
    got = wire.recv()
    assert [(t.dtype, tuple(t.shape)) for t in got] == [(t.dtype, tuple(t.shape)) for t in sent]
    assert all(torch.equal(x, y) for x, y in zip(got, sent))
    a.close()
    b.close()


def test_a_closed_end_is_named_not_waited_on():
    wire, a, b = _pair(poll=lambda: None, timeout=5.0)
    a.close()  # the previous rank died
    with pytest.raises(PeerGone, match="went away"):
        wire.recv()
    b.close()


def test_a_silent_end_times_out():
    wire, a, b = _pair(poll=lambda: None, timeout=0.2)
    with pytest.raises(RuntimeFailure, match="nothing came back from the last stage for 0.2 s"):
        wire.recv()
    a.close()
    b.close()
