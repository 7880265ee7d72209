"""Files that must never be lost: export, plot, --save, --force, --metrics; disk and permission
errors that name the path."""

from __future__ import annotations

from catalogue.case import Case

FILES: list[Case] = []
