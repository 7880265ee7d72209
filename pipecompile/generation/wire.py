"""The ring the ranks of a generation talk over: rank k sends to rank k+1 (what its stage hands
on), the last rank sends to rank 0 (token ids). torch.distributed point-to-point messages in a
gloo process group of the generation's own (``connect``: under `generate --nproc N` the
launcher's store; under torchrun the run's), each message a list of tensors: its header (an
int64 tensor of each tensor's dtype, shape and place, in one fixed-size part where it fits)
first, then the tensors. A tensor on a GPU goes by NCCL where the two ends are on different
GPUs (a ``fast`` group beside the gloo one: the hidden states never leave the devices), else
through host memory by gloo (``generation.places``).

A receive never blocks past what the caller allows: a thread of the wire's own receives the
messages, and the caller waits on them calling ``poll`` meanwhile (rank 0's check of the
ranks it started) and raising after ``timeout`` seconds without a message. A rank that dies
closes its connections, and its neighbours' receives fail at once (``PeerGone``)."""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from pipecompile.errors import RuntimeFailure

__all__ = ["Wire", "connect", "PeerGone", "Fast", "on_device"]

_DTYPES = (torch.int64, torch.float32, torch.bfloat16, torch.float16, torch.float64)
_CODE = {d: k for k, d in enumerate(_DTYPES)}
_POLL_S = 0.05  # how often a waiting receive calls ``poll``
_FLUSH_S = 0.001  # how often a flush looks at the sender's queue
_HEAD = 256  # int64s of a message's first part: its header's length, the header (or its start)
_ON_DEVICE = 16  # added to a tensor's dtype code in the header: it was sent from a GPU


def on_device(t: torch.Tensor) -> bool:
    """Whether ``t`` lies on a GPU (off the host)."""
    return t.device.type != "cpu"


class Fast:
    """The NCCL ends of a rank's wire: ``group`` for tensors on a GPU sent to the next rank
    (``out``) or received from the one before (``into``), on ``device``. Each end is used by
    one of the wire's threads only, and waits for its transfer to finish on the device."""

    def __init__(
        self,
        group: Any = None,
        device: torch.device | None = None,
        out: bool = False,
        into: bool = False,
    ) -> None:
        self.group, self.device, self.out, self.into = group, device, out, into

    def bind(self) -> None:
        """Make the calling thread's current GPU this rank's (CUDA's is per thread)."""
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.set_device(self.device)

    def put(self, t: torch.Tensor, peer: int) -> None:
        self.group.send([t], peer, 0).wait()
        _finished(t.device)

    def get(self, shape: list[int], dtype: torch.dtype, peer: int) -> torch.Tensor:
        t = torch.empty(shape, dtype=dtype, device=self.device)
        self.group.recv([t], peer, 0).wait()
        _finished(t.device)
        return t


def _finished(device: torch.device) -> None:
    """Block until the device's work so far is done (a transfer's wait only orders it)."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


class PeerGone(RuntimeFailure):
    """A neighbour's end of the ring closed: it failed first (its own error says why)."""


class Wire:
    """One rank's two ends of the ring in ``group``: ``send`` to the next rank, ``recv``
    from the one before. A thread of its own receives each message as it comes (gloo's
    receive completes only in a blocking wait), another sends the queued ones in order (a
    send to a rank that died may block until the group's timeout): ``recv`` and ``flush``
    wait on them calling ``poll``, and raise after ``timeout`` seconds (rank 0: a rank
    stopped making progress)."""

    def __init__(
        self,
        group: Any,
        rank: int,
        world: int,
        poll: Callable[[], None] | None = None,
        timeout: float | None = None,
        fast: Fast | None = None,
    ) -> None:
        self.group, self.rank, self.world = group, rank, world
        self.next, self.prev = (rank + 1) % world, (rank - 1) % world
        self.poll, self.timeout = poll, timeout
        self.fast = fast if fast is not None else Fast()
        self._inbox: queue.Queue[list[torch.Tensor] | BaseException] = queue.Queue()
        self._outbox: queue.Queue[list[torch.Tensor]] = queue.Queue()
        self._failed: PeerGone | None = None  # what ended the sender thread
        for target, name in ((self._receive_all, "reader"), (self._send_all, "sender")):
            threading.Thread(target=target, daemon=True, name=f"pipecompile-wire-{name}").start()

    def send(self, tensors: list[torch.Tensor]) -> None:
        """Queue ``tensors`` for the next rank (the sender thread sends them in order)."""
        self._raise_failed()
        self._outbox.put([t.detach().contiguous() for t in tensors])

    def flush(self) -> None:
        """Wait until every queued message is sent (calling ``poll``, and no longer than
        ``timeout`` seconds), then raise what failed the sending, if anything did."""
        start = time.monotonic()
        while self._outbox.unfinished_tasks and self._failed is None:
            self._waited(start, "a message to the next rank was not taken")
            time.sleep(_FLUSH_S)
        self._raise_failed()

    def _waited(self, start: float, what: str) -> None:
        """One beat of a wait begun at ``start``: ``poll``, then raise past ``timeout``."""
        if self.poll is not None:
            self.poll()
        if self.timeout is not None and time.monotonic() - start > self.timeout:
            raise RuntimeFailure(
                f"{what} for {self.timeout:g} s (--timeout): a rank stopped making progress; "
                "the ranks were stopped"
            )

    def _raise_failed(self) -> None:
        if self._failed is not None:
            raise self._failed

    def _send_all(self) -> None:
        """The sender thread: each queued message, in order, until a send fails."""
        self.fast.bind()
        while True:
            tensors = self._outbox.get()
            try:
                self._send(tensors)
            except RuntimeError as err:
                self._failed = PeerGone(f"the next generation rank went away ({_first(err)})")
            finally:
                self._outbox.task_done()
            if self._failed is not None:
                return

    def _send(self, tensors: list[torch.Tensor]) -> None:
        head = [len(tensors)]
        for t in tensors:
            head += [_CODE[t.dtype] + _ON_DEVICE * on_device(t), t.dim(), *t.shape]
        whole = torch.tensor([len(head), *head], dtype=torch.int64)
        first = torch.zeros(_HEAD, dtype=torch.int64)
        first[: min(_HEAD, len(whole))] = whole[:_HEAD]
        self._put(first)
        if len(whole) > _HEAD:  # a long header's rest
            self._put(whole[_HEAD:].contiguous())
        for t in tensors:
            if not t.numel():
                continue
            if on_device(t) and self.fast.out:
                self.fast.put(t, self.next)
            else:
                self._put(t.cpu())

    def _put(self, t: torch.Tensor) -> None:
        self.group.send([t], self.next, 0).wait()

    def recv(self) -> list[torch.Tensor]:
        self._raise_failed()
        start = time.monotonic()
        while True:
            try:
                got = self._inbox.get(timeout=_POLL_S)
                break
            except queue.Empty:
                self._waited(start, "nothing came back from the last stage")
        if isinstance(got, BaseException):
            raise got
        return got

    def ready(self) -> bool:
        """Whether a message has come (a receive would not wait for it)."""
        return not self._inbox.empty()

    def _receive_all(self) -> None:
        """The reader thread: every message, in order, until the previous rank goes."""
        self.fast.bind()
        try:
            while True:
                self._inbox.put(self._message())
        except RuntimeError as err:
            said = f"the previous generation rank went away ({_first(err)})"
            self._inbox.put(PeerGone(said))

    def _message(self) -> list[torch.Tensor]:
        first = self._get(torch.empty(_HEAD, dtype=torch.int64))
        size = int(first[0])
        head = first[1 : size + 1].tolist()
        if size + 1 > _HEAD:
            head += self._get(torch.empty(size + 1 - _HEAD, dtype=torch.int64)).tolist()
        count, k, out = head[0], 1, []
        for _ in range(count):
            placed, code = divmod(head[k], _ON_DEVICE)
            dtype, dims = _DTYPES[code], head[k + 1]
            shape = head[k + 2 : k + 2 + dims]
            k += 2 + dims
            if placed and self.fast.into and math.prod(shape):  # by NCCL, into this GPU
                out.append(self.fast.get(shape, dtype, self.prev))
                continue
            t = torch.empty(shape, dtype=dtype)  # host memory: the stage moves it on
            out.append(self._get(t) if t.numel() else t)
        return out

    def _get(self, t: torch.Tensor) -> torch.Tensor:
        self.group.recv([t], self.prev, 0).wait()
        return t

    def close(self) -> None:
        self.group = None


def _first(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:200]


def connect(
    store: Any,
    rank: int,
    world: int,
    poll: Callable[[], None] | None = None,
    timeout: float | None = None,
    device: torch.device | None = None,
) -> Wire:
    """``rank``'s wire in a gloo group of ``world`` ranks formed on ``store`` (its keys under
    a prefix of their own: the group leaves the store's other keys and any default process
    group alone), its stage on ``device`` (None: the host). Ends on two different GPUs form an
    NCCL group beside it. Every rank must call it."""
    prefixed = dist.PrefixStore("pipecompile/generate/", store)
    wait = timedelta(seconds=max(timeout or 600.0, 60.0))
    formed: list[Any] = []  # formed in a thread, the ranks watched meanwhile (``poll``)

    def form() -> None:
        try:
            group = dist.ProcessGroupGloo(prefixed, rank, world, wait)
            formed.append((group, _fast(prefixed, rank, world, device, wait)))
        except RuntimeError as err:
            formed.append(err)

    thread = threading.Thread(target=form, daemon=True, name="pipecompile-generate-group")
    thread.start()
    while thread.is_alive():
        if poll is not None:
            poll()
        thread.join(0.05)
    if isinstance(formed[0], RuntimeError):
        raise RuntimeFailure(f"the generation ranks did not meet: {_first(formed[0])}")
    group, fast = formed[0]
    return Wire(group, rank, world, poll, timeout, fast)


def _fast(store: Any, rank: int, world: int, device: torch.device | None, wait: timedelta) -> Fast:
    """The NCCL ends of ``rank``: each rank says where it runs, and a link between two
    different GPUs takes NCCL (both its ends see the same two names, so they agree)."""
    from pipecompile.generation.places import CPU, identity

    here = identity(device) if device is not None else CPU
    store.set(f"device/{rank}", here)
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    store.wait([f"device/{nxt}", f"device/{prev}"], wait)

    def gpus_apart(other: int) -> bool:
        there = store.get(f"device/{other}").decode()
        return here != CPU and there != CPU and there != here

    out, into = gpus_apart(nxt), gpus_apart(prev)
    if not (out or into):
        return Fast(device=device)
    group = dist.ProcessGroupNCCL(dist.PrefixStore("nccl/", store), rank, world, wait)
    return Fast(group, device, out, into)
