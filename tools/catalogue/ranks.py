"""Under --nproc: ranks that read data agree on each batch, the hook's output is shown, --timeout
bounds every wait."""

from __future__ import annotations

from catalogue.case import Case

RANKS: list[Case] = []
