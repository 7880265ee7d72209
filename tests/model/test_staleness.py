"""A directory whose model file changed after the compile is refused as stale at every door
that reads the compiled stages as that model's (`run` and `generate` in their own tests, here
``load()``, `export` and `show --measured`), naming the recompile command; ``--allow-stale``
(``allow_stale=True``) goes on with the compiled stages."""

from __future__ import annotations

import shutil

import pytest
import torch

import pipecompile
from pipecompile.errors import ModelFileError
from pipecompile.surfaces.cli import main
from tests.conftest import EXAMPLES


@pytest.fixture(scope="module")
def stale(tmp_path_factory):  # type: ignore[no-untyped-def]
    d = tmp_path_factory.mktemp("stale")
    shutil.copy(EXAMPLES / "mlp.py", d / "mlp.py")
    out = d / "out"
    assert main([str(d / "mlp.py"), "--stages", "2", "-q", "-o", str(out)]) == 0
    pipecompile.load(out)  # fresh: loads
    with (d / "mlp.py").open("a") as f:
        f.write("\n# edited after the compile\n")
    return out


def test_load_refuses_a_stale_directory_unless_allowed(stale):
    said = (
        r"is stale: .*mlp\.py changed after it was compiled.*recompile \(`pipecompile "
        r".*mlp\.py:build_model --stages 2 --schedule gpipe --microbatches 1 -o .*\), or pass "
        r"allow_stale=True to use"
    )
    with pytest.raises(ModelFileError, match=said):
        pipecompile.load(stale)
    taken = pipecompile.load(stale, allow_stale=True)  # and its fit() takes it too
    x, y = torch.randn(8, 32), torch.randn(8, 10)
    assert taken.fit([((x,), y)], torch.nn.functional.mse_loss, "sgd", steps=1)


def test_export_and_show_measured_refuse_it_as_run_does(stale, tmp_path, capsys):
    target = tmp_path / "w.safetensors"
    assert main(["export", str(stale), "-o", str(target)]) == 2
    assert "is stale" in capsys.readouterr().err and not target.exists()
    assert main(["export", str(stale), "-o", str(target), "--allow-stale"]) == 0
    assert target.is_file()
    assert main(["show", str(stale), "--measured", str(tmp_path / "t.json")]) == 2
    assert "pass --allow-stale to compare the traced run with" in capsys.readouterr().err
    assert main(["run", str(stale), "-q"]) == 2
    assert "pass --allow-stale to use the compiled stages" in capsys.readouterr().err
