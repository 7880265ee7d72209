"""One table of ONNX translations per process for pipecompile's exports.

``torch.onnx.export`` (the dynamo-based exporter) builds its registry of ATen-to-ONNX
functions anew on every call, reading the source of some 500 onnxscript functions: about 3 s of
CPU per stage exported, more than the export of a small stage itself. pipecompile never adds to
that registry (it passes no custom translation table), so within its own exports the registry
the first one built is reused. Outside them, ``torch.onnx.export`` is left as it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["shared_registry"]

_BUILT: dict[tuple[Any, ...], Any] = {}


@contextmanager
def shared_registry() -> Iterator[None]:
    """Within, ``torch.onnx.export`` reuses the translation registry of an earlier export (one
    per opset). A torch without that registry where it is looked for exports as before.

    Example:
        >>> with shared_registry():  # doctest: +SKIP
        ...     for stage, args, path in stages:
        ...         torch.onnx.export(stage, args, path, dynamo=True)
    """
    try:
        from torch.onnx._internal.exporter import _registration

        registry = _registration.ONNXRegistry
        original = registry.__dict__["from_torchlib"]
        build = original.__func__
    except (ImportError, AttributeError, KeyError):
        yield
        return

    def reused(cls: type, *args: Any, **kwargs: Any) -> Any:
        key = (cls, args, tuple(sorted(kwargs.items())))
        if key not in _BUILT:
            _BUILT[key] = build(cls, *args, **kwargs)
        return _BUILT[key]

    registry.from_torchlib = classmethod(reused)
    try:
        yield
    finally:
        registry.from_torchlib = original
