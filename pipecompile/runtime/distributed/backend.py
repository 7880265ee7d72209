"""The distributed backend: one rank per device, torch.distributed point-to-point messages.

Every message's shape and dtype come from the manifest's edges (the compiled stage graph),
so nothing but the tensors themselves crosses the wire. A message is matched by its tag,
derived from (edge, direction, micro-batch), so sends and receives pair up whatever order the
two devices' programs issue them in. Tied parameters are summed with one asynchronous
all-reduce per parameter over the ranks that hold it; the STEP waits for it.
"""

from __future__ import annotations

import functools
import os
import queue
import threading
from collections.abc import Hashable, Sequence
from concurrent.futures import Future
from typing import Any

import torch
import torch.distributed as dist

from pipecompile.errors import RuntimeFailure
from pipecompile.ir.records.manifest import Manifest
from pipecompile.runtime.backend import MessageKey, tie_of
from pipecompile.runtime.job.placement import Placement
from pipecompile.runtime.layout import Layout
from pipecompile.runtime.local_backend import MISSING

__all__ = ["DistBackend", "tie_groups"]


def tie_groups(layout: Layout, placement: Placement, copies: int = 1) -> dict[Hashable, Any]:
    """One process group per tied parameter held on several ranks (every replica of every
    holder), and one per replicated device, keyed ("replicas", device): those of this rank's
    copy of the pipeline (``placement``), of ``copies``. Every rank must call this, in the
    same order, since creating a group is collective (every copy's groups are created)."""
    groups: dict[Hashable, Any] = {}
    me = dist.get_rank()
    for c in range(copies):
        each = placement.copy(c)
        for key in sorted(layout.ties):
            ranks = sorted({r for j in layout.ties[key] for r in each.ranks_of_stage(j)})
            if len(ranks) > 1:
                group = dist.new_group(ranks)
                if me in ranks:
                    groups[key] = group
        for d, count in enumerate(each.device_replicas):
            if count > 1:
                ranks = each.ranks_of_device(d)
                group = dist.new_group(ranks)
                if me in ranks:
                    groups[("replicas", d)] = group
    return groups


def _why(dynamic: bool) -> str:
    if dynamic:
        return (
            " (from the batch's sizes of the --dynamic dimensions): the model makes a shape the "
            "compile's probe did not see; check it with run --check --batch-shapes"
        )
    return (
        " (the compiled shape): the batch differs from the example in a dimension the compile "
        "fixed; recompile with --dynamic seq (or dynamic_shapes()) to let another one vary"
    )


def _on_wire(dtype: torch.dtype, wire: torch.dtype | None) -> torch.dtype:
    if wire is not None and dtype.is_floating_point and dtype.itemsize > wire.itemsize:
        return wire
    return dtype


class _Poster:
    """One thread that posts sends and receives for the rank's main thread: posting a gloo
    send or receive can block its caller for milliseconds while the connection's own thread
    reads another message, and the main thread computes meanwhile. A daemon thread, not a
    ``ThreadPoolExecutor``'s: a rank ending on an error while a receive from a dead peer
    blocks here must not wait for it at exit."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, daemon=True, name="pipecompile-messages").start()

    def submit(self, call: Any, *args: Any) -> Future:
        future: Future = Future()
        self._queue.put((future, call, args))
        return future

    def _loop(self) -> None:
        while True:
            future, call, args = self._queue.get()
            try:
                future.set_result(call(*args))
            except BaseException as err:  # the main thread raises it where it waits
                future.set_exception(err)


@functools.cache
def _poster() -> _Poster:
    """The process's one helper thread (a backend is made each step)."""
    return _Poster()


class DistBackend:
    """Messages and tied-gradient sums between this rank and the others."""

    def __init__(
        self,
        layout: Layout,
        manifest: Manifest,
        microbatches: int,
        groups: dict,
        placement: Placement | None = None,
        *,
        device: torch.device | None = None,
        wire_dtype: torch.dtype | None = None,
    ) -> None:
        """``wire_dtype``: floating-point values (and their gradients) travel in it when it
        is narrower than their own (mixed precision)."""
        self.device = device or torch.device("cpu")
        self.sent_bytes = 0
        self.layout = layout
        self.placement = placement or Placement(
            layout.stage_device, (1,) * (max(layout.stage_device) + 1)
        )
        self.rank = dist.get_rank()
        self.microbatches = microbatches
        self.groups = groups
        self.edges = {
            (e.src, e.dst, e.value): (k, e.shape, _on_wire(getattr(torch, e.dtype), wire_dtype))
            for k, e in enumerate(manifest.edges)
        }
        self._sends: list[tuple[Future, torch.Tensor]] = []  # the send's work, its tensor
        self._inbox: dict[Hashable, torch.Tensor | None] = {}
        # posted ahead: (the works of the call that posted it, its place there, its buffer)
        self._early: dict[Hashable, tuple[Future, int, torch.Tensor]] = {}
        self._posted: dict[Hashable, dict[int, torch.Tensor]] = {}
        self._sums: dict[Hashable, tuple[Any, torch.Tensor, set[int]]] = {}
        self.dynamic = manifest.dynamic
        self._sizes: list[dict[str, int]] | None = None  # per micro-batch (--dynamic)

    def resize(self, sizes: list[dict[str, int]]) -> None:
        """The step's sizes of the dimensions compiled ``--dynamic``, per micro-batch: each
        message's shape follows them as the manifest says (no shape crosses the wire)."""
        self._sizes = sizes

    def _shape(self, name: str, i: int, shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape if self._sizes is None else self.dynamic.shape_of(name, shape, self._sizes[i])

    # -- point to point ------------------------------------------------------------------

    def send(self, key: MessageKey, value: torch.Tensor | None) -> None:
        kind, src, dst, i, name = key
        index, shape, dtype = self.edges[(src, dst, name)]
        want = self._shape(name, i, shape)  # what the receiver allocates
        if kind == "B":
            if not dtype.is_floating_point:
                return  # integer values carry no gradient; the receiver expects none
            if value is None:  # sums like none
                value = torch.zeros(want, dtype=dtype, device=self.device)
        tensor = value.detach().to(dtype).contiguous()  # type: ignore[union-attr]
        if tuple(tensor.shape) != want:  # the receiver sizes it as the manifest predicts
            raise RuntimeFailure(
                f"stage {src if kind == 'F' else dst} made {name!r} of micro-batch {i} in shape "
                f"{list(tensor.shape)}, but the rank receiving it expects {list(want)}"
                f"{_why(self._sizes is not None)}"
            )
        self.sent_bytes += tensor.numel() * tensor.element_size()
        peer = self.placement.rank_of(dst if kind == "F" else src, i)
        sent = self._posting(dist.isend, tensor, peer, None, self._tag(kind, index, i))
        self._sends.append((sent, tensor))

    def post(self, keys: Sequence[MessageKey]) -> None:
        """Start receiving ``keys`` now, ahead of the instruction that takes them: the message
        lands in its buffer while this rank computes, and ``ready`` only waits for what is
        still missing."""
        ops, buffers = self._receives([k for k in keys if k not in self._early])
        if not ops:
            return
        posted = self._posting(dist.batch_isend_irecv, ops)
        for k, (key, buffer) in enumerate(buffers):
            self._early[key] = (posted, k, buffer)

    def _posting(self, call: Any, *args: Any) -> Future:
        """``call(*args)`` (a send or receives ahead) posted by the helper thread on gloo,
        unless PIPECOMPILE_POST_THREAD=0 (for measuring the gain; read here, not on import, as
        the rank starter imports once for every later run); else, and on NCCL, whose posts
        never block, called now. Its result, the works, comes from the future either way."""
        if self.device.type == "cpu" and os.environ.get("PIPECOMPILE_POST_THREAD") != "0":
            return _poster().submit(call, *args)
        done: Future = Future()
        done.set_result(call(*args))
        return done

    def ready(self, keys: Sequence[MessageKey]) -> bool:
        """Receive every message in ``keys`` (one batched call for those not posted ahead),
        blocking until they arrive."""
        ops, buffers = self._receives([k for k in keys if k not in self._early])
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        for key in keys:
            if key in self._early:
                posted, k, buffer = self._early.pop(key)
                posted.result()[k].wait()
                buffers.append((key, buffer))
        self._inbox.update(buffers)
        return True

    def _receives(self, keys: Sequence[MessageKey]) -> tuple[list, list]:
        """The receive ops of ``keys`` and their (key, buffer) pairs; an integer value's
        gradient is no message (it goes straight to the inbox as None)."""
        ops, buffers = [], []
        for key in keys:
            kind, src, dst, i, name = key
            index, shape, dtype = self.edges[(src, dst, name)]
            if kind == "B" and not dtype.is_floating_point:
                self._inbox[key] = None
                continue
            buffer = torch.empty(self._shape(name, i, shape), dtype=dtype, device=self.device)
            peer = self.placement.rank_of(src if kind == "F" else dst, i)
            ops.append(dist.P2POp(dist.irecv, buffer, peer, tag=self._tag(kind, index, i)))
            buffers.append((key, buffer))
        return ops, buffers

    def recv(self, key: MessageKey) -> torch.Tensor | None:
        return self._inbox.pop(key)

    def finish(self) -> None:
        """Wait for every send of the step (their buffers must live until then); a receive
        posted ahead is always taken within its step (the program receives what it posts)."""
        assert not self._early, f"receives posted but never taken: {sorted(self._early)}"
        for sent, _ in self._sends:
            sent.result().wait()
        self._sends.clear()

    def _tag(self, kind: str, edge: int, i: int) -> int:
        return (edge * 2 + (kind == "B")) * self.microbatches + i

    # -- tied parameters -----------------------------------------------------------------

    def contribute(
        self, key: Hashable, member: int, members: Sequence[int], tensor: torch.Tensor
    ) -> None:
        """Add this stage's gradient; once every stage of this rank has, start the all-reduce
        over the ranks holding the parameter (asynchronously)."""
        local = [s for s in members if self.rank in self.placement.ranks_of_stage(s)]
        posted = self._posted.setdefault(key, {})
        posted[member] = tensor
        if len(posted) < len(local):
            return
        total = posted[local[0]].clone()
        for other in local[1:]:
            total += posted[other]
        del self._posted[key]
        group = self.groups.get(tie_of(key))
        work = dist.all_reduce(total, group=group, async_op=True) if group is not None else None
        self._sums[key] = (work, total, set(local))

    def reduce_replicas(self, stage: int, params: list[torch.nn.Parameter]) -> None:
        """Sum ``params``' gradients over the ranks replicating ``stage`` (one flat
        all-reduce; a missing gradient counts as zero)."""
        group = self.groups.get(("replicas", self.placement.stage_device[stage]))
        if group is None or not params:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=group)
        offset = 0
        for p, g in zip(params, grads):
            p.grad = flat[offset : offset + g.numel()].view_as(g).clone()
            offset += g.numel()

    def has_reduced(self, key: Hashable, member: int) -> bool:
        pending = self._sums.get(key)
        if pending is None:
            return False
        if pending[0] is not None:
            pending[0].wait()
            self._sums[key] = (None, pending[1], pending[2])
        return True

    def reduced(self, key: Hashable, member: int) -> torch.Tensor | object:
        pending = self._sums.get(key)
        if pending is None or member not in pending[2]:
            return MISSING
        _, total, waiting = pending
        waiting.discard(member)
        if not waiting:
            del self._sums[key]
        return total
