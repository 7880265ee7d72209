"""Sizes as people write them."""

from __future__ import annotations

import pytest

from pipecompile.ir.records.sizes import format_size, parse_size


@pytest.mark.parametrize(
    "text, value",
    [("1048576", 1048576), ("512MiB", 512 * 2**20), ("2GB", 2 * 10**9), ("1.5G", 3 * 2**29),
     ("10 kb", 10_000), ("3K", 3072), ("7b", 7)],
)  # fmt: skip
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "lots", "12 parsecs", "-3MiB", "1e9"])
def test_bad_sizes_say_what_to_write(text):
    with pytest.raises(ValueError, match="write e.g. 512MiB, 2GB"):
        parse_size(text)


def test_format_size():
    assert format_size(3.46 * 2**30) == "3.46 GiB"
    assert format_size(512) == "512 B"


def test_counted_says_one_micro_batch():
    from pipecompile.ir.records.sizes import counted

    assert counted(1, "micro-batch") == "1 micro-batch"
    assert counted(4, "micro-batch") == "4 micro-batches"
    assert counted(2, "device") == "2 devices" and counted(0, "stage") == "0 stages"
