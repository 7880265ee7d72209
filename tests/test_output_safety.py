"""Never lose a user's file: output directories, checkpoints beside them, export targets."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipecompile.codegen.output_dir import check_replaceable, owned_names
from pipecompile.errors import EmitError
from pipecompile.ir.records.manifest import read_manifest
from pipecompile.surfaces.cli import main
from tests.conftest import EXAMPLES

MLP = str(EXAMPLES / "mlp.py")


def _compile(out: Path, *extra: str) -> int:
    return main([MLP, "--stages", "2", "--microbatches", "2", "-q", "-o", str(out), *extra])


@pytest.fixture(scope="module")
def emitted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("emitted") / "mlp"
    assert _compile(out) == 0
    return out


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*")
            if p.is_file()}  # fmt: skip


def test_unrelated_manifest_does_not_make_a_directory_ours(tmp_path, capsys):
    webapp = tmp_path / "webapp"
    webapp.mkdir()
    (webapp / "manifest.json").write_text('{"name": "my app", "start_url": "/"}\n')
    (webapp / "index.html").write_text("<html></html>\n")
    before = _snapshot(webapp)
    assert _compile(webapp) == 2
    err = capsys.readouterr().err
    assert "is not a pipecompile output" in err and "index.html" in err and "--force" in err
    assert _snapshot(webapp) == before


def test_recompile_refuses_to_delete_user_files(tmp_path, capsys):
    out = tmp_path / "x"
    assert _compile(out) == 0
    (out / "NOTES.md").write_text("my notes\n")
    (out / "results").mkdir()
    (out / "results" / "run1.txt").write_text("0.5\n")
    before = _snapshot(out)
    assert _compile(out, "--stages", "3") == 2
    err = capsys.readouterr().err
    assert "NOTES.md" in err and "results/" in err
    assert _snapshot(out) == before


def test_force_writes_beside_user_files_and_drops_only_our_stale_ones(tmp_path):
    out = tmp_path / "x"
    assert main([MLP, "--stages", "3", "-q", "-o", str(out)]) == 0
    (out / "NOTES.md").write_text("my notes\n")
    assert _compile(out, "--force") == 0
    names = {p.name for p in out.iterdir()}
    assert "NOTES.md" in names and (out / "NOTES.md").read_text() == "my notes\n"
    assert "stage_2.py" not in names and "stage_2.safetensors" not in names  # ours, now stale
    assert json.loads((out / "manifest.json").read_text())["stages"][1]["file"] == "stage_1.py"
    assert main(["run", str(out), "-q"]) == 0


@pytest.mark.parametrize("name", ["manifest.json", "stage_0.py", "program.txt"])
def test_force_never_replaces_a_users_file_named_as_ours(tmp_path, capsys, name):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / name).write_text("mine")
    (mine / "notes.txt").write_text("mine too")
    before = _snapshot(mine)
    assert _compile(mine, "--force") == 2
    err = capsys.readouterr().err
    assert f"{name} among them under a name it may write" in err and "choose another -o" in err
    assert _snapshot(mine) == before


def test_force_notes_what_it_kept(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    assert _compile(mine, "--force") == 0
    assert f"pipecompile: note: kept notes.txt in {mine}" in capsys.readouterr().err
    assert (mine / "notes.txt").read_text() == "mine"


def test_an_edited_stage_of_our_own_is_replaced_by_a_recompile(tmp_path):
    out = tmp_path / "x"
    assert _compile(out) == 0
    original = (out / "stage_0.py").read_text()
    (out / "stage_0.py").write_text(original + "# my experiment\n")
    assert _compile(out) == 0 and (out / "stage_0.py").read_text() == original


def test_recompile_replaces_its_own_output(tmp_path):
    out = tmp_path / "x"
    assert main([MLP, "--stages", "3", "-q", "-o", str(out)]) == 0
    assert _compile(out) == 0
    assert not (out / "stage_2.py").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left


def test_checkpoints_never_go_inside_the_compiled_directory(emitted, capsys):
    before = _snapshot(emitted)
    assert main(["run", str(emitted), "-q", "--save", str(emitted / "checkpoints")]) == 2
    assert "recompile replaces" in capsys.readouterr().err
    assert _snapshot(emitted) == before


def test_checkpoints_beside_survive_a_recompile(tmp_path):
    out, saved = tmp_path / "x", tmp_path / "x-checkpoints"
    assert _compile(out) == 0
    assert main(["run", str(out), "-q", "--steps", "2", "--save", str(saved)]) == 0
    before = _snapshot(saved)
    metrics = (out / "metrics.jsonl").read_text()
    assert _compile(out) == 0
    assert _snapshot(saved) == before
    assert (out / "metrics.jsonl").read_text() == metrics  # the runs' history is carried over


def test_export_never_overwrites_a_users_file(emitted, tmp_path, capsys):
    target = tmp_path / "mine.safetensors"
    target.write_bytes(b"precious")
    for force in ([], ["--force"]):
        assert main(["export", str(emitted), "-o", str(target), *force]) == 2
        assert "did not write it; it is never replaced" in capsys.readouterr().err
        assert target.read_bytes() == b"precious"
    # a directory is a sharded export: refused where it holds files an export did not write
    assert main(["export", str(emitted), "-o", str(tmp_path)]) == 2
    assert "holds mine.safetensors, which an export did not write" in capsys.readouterr().err
    assert target.is_file() and not list(tmp_path.glob("model-*"))
    (tmp_path / "dir.safetensors").mkdir()
    assert main(["export", str(emitted), "-o", str(tmp_path / "dir.safetensors")]) == 2
    assert "is a directory; a .safetensors name must be a file" in capsys.readouterr().err


def test_viz_onto_a_file_is_refused(emitted, tmp_path, capsys):
    target = tmp_path / "picture.svg"
    target.write_text("mine")
    assert main(["viz", str(emitted), "-o", str(target)]) == 2
    assert "is a file" in capsys.readouterr().err
    assert target.read_text() == "mine"


@pytest.mark.parametrize("make", ["file", "under_file", "long_name", "read_only"])
def test_bad_output_paths_are_clear_errors(tmp_path, capsys, make):
    blocker = tmp_path / "blocker"
    blocker.write_text("mine")
    target = {
        "file": blocker,
        "under_file": blocker / "out",
        "long_name": tmp_path / ("x" * 300),
        "read_only": tmp_path / "ro" / "out",
    }[make]
    if make == "read_only":
        (tmp_path / "ro").mkdir(mode=0o555)
        if _writable(tmp_path / "ro"):  # root writes anywhere, but not under /proc
            target = Path("/proc/pipecompile-test/out")
    assert _compile(target) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipecompile: error:") and "Traceback" not in err
    assert len(err.strip().splitlines()) <= 2
    assert blocker.read_text() == "mine"
    assert not [p for p in tmp_path.rglob(".pipecompile-tmp-*")]


def _writable(directory: Path) -> bool:
    probe = directory / ".probe"
    try:
        probe.write_text("")
    except OSError:
        return False
    probe.unlink()
    return True


def test_owned_names_cover_everything_a_compile_writes(emitted):
    assert {p.name for p in emitted.iterdir()} <= owned_names(read_manifest(emitted))
    assert check_replaceable(emitted) == []


def test_api_save_keeps_the_same_rules(emitted, tmp_path):
    import pipecompile

    pipe = pipecompile.load(emitted)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "data.csv").write_text("1,2\n")
    with pytest.raises(EmitError, match="data.csv"):
        pipe.save(mine)
    pipe.save(mine, force=True)
    assert (mine / "data.csv").read_text() == "1,2\n"
    assert pipecompile.load(mine).state_dict().keys() == pipe.state_dict().keys()
    shutil.rmtree(mine)
