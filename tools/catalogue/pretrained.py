"""--weights: every model tensor loaded or named, prefixes resolved as from_pretrained resolves
them."""

from __future__ import annotations

from catalogue.case import Case

PRETRAINED: list[Case] = []
