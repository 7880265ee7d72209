"""The ring the ranks of `generate --nproc N` talk over: rank k sends to rank k+1 (hidden
states), the last rank sends to rank 0 (token ids). One TCP connection per neighbour on this
machine, each message a list of tensors framed with their dtypes and shapes.

Plain sockets, not a process group: a receive can wait with a deadline and look at the other
ranks meanwhile without breaking the connection, and a rank that dies closes its sockets, so
its neighbours learn it at once instead of after a collective timeout."""

from __future__ import annotations

import select
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import torch

from pipecompile.errors import RuntimeFailure

__all__ = ["Wire", "ring", "PeerGone"]

_DTYPES = (torch.int64, torch.float32, torch.bfloat16, torch.float16, torch.float64)
_CODE = {d: k for k, d in enumerate(_DTYPES)}
_LONG = struct.Struct("<q")


class PeerGone(RuntimeFailure):
    """A neighbour's end of the ring closed: it failed first (its own error says why)."""


class Wire:
    """One rank's two ends of the ring: ``send`` to the next rank, ``recv`` from the one
    before. ``poll`` (rank 0's check of its ranks) is called while a receive waits, and a
    receive that waits past ``timeout`` seconds raises (rank 0: a rank stopped making
    progress)."""

    def __init__(
        self,
        inbox: socket.socket,
        outbox: socket.socket,
        poll: Callable[[], None] | None = None,
        timeout: float | None = None,
    ) -> None:
        self.inbox, self.outbox, self.poll, self.timeout = inbox, outbox, poll, timeout

    def send(self, tensors: list[torch.Tensor]) -> None:
        head = [len(tensors)]
        blobs = []
        for t in tensors:
            t = t.detach().contiguous()
            head += [_CODE[t.dtype], t.dim(), *t.shape]
            blobs.append(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        raw = struct.pack(f"<{len(head) + 1}q", len(head), *head)
        try:
            self.outbox.sendall(raw + b"".join(blobs))
        except OSError as err:
            raise PeerGone(f"the next generation rank went away ({err})") from err

    def recv(self) -> list[torch.Tensor]:
        (size,) = _LONG.unpack(self._exactly(_LONG.size))
        head = list(struct.unpack(f"<{size}q", self._exactly(8 * size)))
        count, k, out = head[0], 1, []
        for _ in range(count):
            dtype, dims = _DTYPES[head[k]], head[k + 1]
            shape = head[k + 2 : k + 2 + dims]
            k += 2 + dims
            n = dtype.itemsize
            for d in shape:
                n *= d
            blob = bytearray(self._exactly(n))
            flat = (
                torch.frombuffer(blob, dtype=torch.uint8)
                if n
                else torch.empty(0, dtype=torch.uint8)
            )
            out.append(flat.view(dtype).reshape(shape))
        return out

    def ready(self) -> bool:
        """Whether a message has begun to arrive (a receive would not wait for its start)."""
        return bool(select.select([self.inbox], [], [], 0)[0])

    def _exactly(self, n: int) -> bytes:
        parts, got = [], 0
        while got < n:
            if self.poll is not None:
                self._wait()
            chunk = self.inbox.recv(min(n - got, 1 << 20))
            if not chunk:
                raise PeerGone("the previous generation rank went away mid-message")
            parts.append(chunk)
            got += len(chunk)
        return b"".join(parts)

    def _wait(self) -> None:
        start = time.monotonic()
        while not select.select([self.inbox], [], [], 0.05)[0]:
            self.poll()  # type: ignore[misc]
            if self.timeout is not None and time.monotonic() - start > self.timeout:
                raise RuntimeFailure(
                    f"nothing came back from the last stage for {self.timeout:g} s (--timeout): "
                    "a rank stopped making progress; the ranks were stopped"
                )

    def close(self) -> None:
        for s in (self.inbox, self.outbox):
            s.close()


def ring(
    store: Any,
    rank: int,
    world: int,
    poll: Callable[[], None] | None = None,
    timeout: float | None = None,
) -> Wire:
    """Connect ``rank`` to its neighbours: listen, publish the port in ``store``, connect to
    the next rank's port, accept the previous rank."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    store.set(f"generate/port/{rank}", str(listener.getsockname()[1]))
    nxt = (rank + 1) % world
    while poll is not None and not store.check([f"generate/port/{nxt}"]):
        poll()
        select.select([], [], [], 0.05)
    port = int(store.get(f"generate/port/{nxt}"))
    outbox = socket.create_connection(("127.0.0.1", port))
    outbox.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if poll is not None:
        while not select.select([listener], [], [], 0.05)[0]:
            poll()
    inbox, _ = listener.accept()
    listener.close()
    return Wire(inbox, outbox, poll, timeout)
