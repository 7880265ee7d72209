"""Disk and permission errors read as one line naming the path; places are probed first."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from safetensors import SafetensorError

from pipecompile.errors import EmitError
from pipecompile.files.disk import disk_message, os_error, writing
from pipecompile.files.writable import check_directory, check_file


def test_disk_message_names_the_path_and_the_fix():
    full = OSError(errno.ENOSPC, "No space left on device", "ck/step_3/x")
    text = disk_message("write train state step_3 to", "ck", full)
    assert text == (
        "cannot write train state step_3 to ck (ck/step_3/x): the disk is full; free space "
        "there or choose another place"
    )
    assert "permission denied" in disk_message("write", "p", OSError(errno.EACCES, "x"))


def test_the_os_error_behind_safetensors_and_torch_save_is_found():
    assert os_error(SafetensorError("I/O error: No space left (os error 28)")).errno == 28
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("unexpected pos 704 vs 598")  # noqa: B904 - as torch.save does
    except RuntimeError as err:
        assert os_error(err).errno == errno.ENOSPC
    assert os_error(ValueError("no")) is None


def test_writing_turns_only_disk_errors_into_one_line():
    with pytest.raises(EmitError, match=r"^cannot write the plot to p\.svg: the disk is full"):
        with writing("write the plot to", "p.svg"):
            raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(KeyError):
        with writing("write the plot to", "p.svg"):
            raise KeyError("a bug stays a bug")


def test_a_file_where_a_directory_is_needed_and_the_reverse(tmp_path):
    blocker = tmp_path / "notes.txt"
    blocker.write_text("mine")
    with pytest.raises(EmitError, match="cannot write train state to .*notes.txt: it is a file"):
        check_directory(blocker, "train state")
    with pytest.raises(EmitError, match="notes.txt is a file, not a directory"):
        check_directory(blocker / "ck", "train state")
    with pytest.raises(EmitError, match="it is a directory; name a file"):
        check_file(tmp_path, "metrics")
    check_directory(tmp_path / "new" / "deeper", "train state")
    check_file(tmp_path / "new" / "m.jsonl", "metrics", append=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # probes leave nothing
    assert blocker.read_text() == "mine"


def test_a_place_that_cannot_be_written_is_named(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    probe = locked / ".probe"
    try:
        probe.write_text("")
    except OSError:
        pass
    else:  # root ignores permission bits; /proc refuses everyone
        probe.unlink()
        locked = Path("/proc/pipecompile-test")
    with pytest.raises(EmitError, match=f"cannot write train state to {locked}/ck: ") as caught:
        check_directory(locked / "ck", "train state")
    assert ".pipecompile-probe" not in str(caught.value)
    os.chmod(tmp_path / "locked", 0o755)
