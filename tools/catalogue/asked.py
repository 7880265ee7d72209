"""Runs that must do exactly what was asked, or say why not: data hooks, --steps and epochs, losses
and optimizers, options that would be ignored."""

from __future__ import annotations

from catalogue.case import Case

ASKED: list[Case] = []
