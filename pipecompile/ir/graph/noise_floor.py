"""How far a result may be from its reference: a bound taken from the numbers' own rounding.

The reference is computed twice, in the model's dtype and in float64; how far those two are
apart (the noise floor) is the error rounding alone makes on that value. A result agrees when
its distance to the reference is within ``NOISE_FACTOR`` noise floors, plus a few units in the
last place of the value's largest magnitude (so exactly computed values, whose noise floor is
0, may still differ by a rounding). Deep models, whose rounding grows, are not failed for it,
and shallow ones, whose rounding is small, cannot hide a real error below a fixed tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "NOISE_FACTOR",
    "ULPS",
    "FIXED",
    "Agreement",
    "Tolerance",
    "NOISE_RULE",
    "agreement",
    "within_rounding",
]

NOISE_FACTOR = 16.0  # noise floors a result may be off
ULPS = 8.0  # units in the last place of the largest magnitude, for exactly computed values
FIXED = 1e-5  # atol and rtol where no float64 twin could be computed


@dataclass(frozen=True)
class Tolerance:
    """Tolerances a user gave (``--atol``/``--rtol``): when either is given, a value agrees
    when within ``atol + rtol * |reference|`` (``FIXED`` for the one not given) instead of
    the noise-floor rule; ``Tolerance()``: the noise-floor rule."""

    atol: float | None = None
    rtol: float | None = None

    @property
    def given(self) -> bool:
        return self.atol is not None or self.rtol is not None

    def bounds(self) -> tuple[float, float]:
        """(atol, rtol), ``FIXED`` for each not given."""
        return (
            FIXED if self.atol is None else self.atol,
            FIXED if self.rtol is None else self.rtol,
        )


NOISE_RULE = Tolerance()  # no tolerance given: the noise-floor rule decides


@dataclass(frozen=True)
class Agreement:
    """``error``: max |result - reference|; ``noise``: max |reference - float64 reference|;
    ``bound``: the error allowed."""

    error: float
    noise: float
    bound: float

    @property
    def ok(self) -> bool:
        return self.error <= self.bound  # NaN is never ok

    @property
    def ratio(self) -> float:
        """The error in noise floors (0 for an exact result, inf above a zero floor)."""
        if self.error == 0:
            return 0.0
        return self.error / self.noise if self.noise > 0 else float("inf")

    def __str__(self) -> str:
        return (
            f"max |diff| {self.error:.3e}, noise floor {self.noise:.3e} "
            f"({_ratio_text(self.ratio)}), allowed {self.bound:.3e}"
        )


def agreement(
    result: torch.Tensor,
    reference: torch.Tensor,
    exact: torch.Tensor | None,
    floor: float = 0.0,
) -> Agreement:
    """Compare ``result`` with ``reference``, whose float64 twin is ``exact`` (None: a model
    that cannot run in float64; then ``FIXED`` absolute plus ``FIXED`` of the largest
    magnitude is allowed, and the noise floor reads 0). ``floor``: a noise floor measured
    elsewhere (the same eager values computed by another device's kernels, which round
    otherwise); the larger of the two is used.

    Example:
        >>> x = torch.randn(8, dtype=torch.float64)
        >>> agreement(x.float(), x.float(), x).ok
        True
    """
    want, have = _real(reference.detach()), _real(result.detach())
    have = have.to(want.dtype)
    if have.shape != want.shape:
        return Agreement(float("inf"), 0.0, 0.0)
    if not want.is_floating_point():
        error = float((have != want).sum() > 0)
        return Agreement(error, 0.0, 0.0)
    if want.numel() == 0 or torch.equal(have, want):  # exact: no floor to measure
        return Agreement(0.0, 0.0, 0.0)
    same = (have == want) | (have.isnan() & want.isnan())  # equal infinities, NaN for NaN
    error = _max_abs(torch.where(same, 0.0, have.double() - want.double()))
    if exact is None:
        scale = _max_abs(want.double())
        return Agreement(error, 0.0, FIXED + FIXED * scale)
    exact64 = _real(exact.detach()).to(torch.float64)
    noise = max(_max_abs(want.double() - exact64), floor)
    scale = _max_abs(exact64)
    bound = NOISE_FACTOR * noise + ULPS * torch.finfo(want.dtype).eps * scale
    return Agreement(error, noise, bound)


def within_rounding(result: torch.Tensor, reference: torch.Tensor) -> bool:
    """Whether ``result`` is within ``ULPS`` units in the last place of ``reference``'s largest
    magnitude: the least any ``agreement`` allows, so such a result needs no float64 twin."""
    want, have = _real(reference.detach()), _real(result.detach())
    if have.shape != want.shape or not want.is_floating_point():
        return have.shape == want.shape and torch.equal(have, want)
    if want.numel() == 0 or torch.equal(have, want):
        return True
    error = _max_abs(have.double() - want.double())
    return error <= ULPS * torch.finfo(want.dtype).eps * _max_abs(want.double())


def _real(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t) if t.is_complex() else t


def _max_abs(t: torch.Tensor) -> float:
    finite = torch.nan_to_num(t.abs(), nan=float("inf"))
    return float(finite.max()) if t.numel() else 0.0


def _ratio_text(ratio: float) -> str:
    if ratio == float("inf"):
        return "above a zero floor"
    return f"{ratio:.2g}x the floor"
