"""torchvision's classification models: every name ``list_models(module=torchvision.models)``
gives, built by ``get_model(name, weights=None, num_classes=10, ...)`` on 64x64 images where the
model takes them."""

from __future__ import annotations

import json
import subprocess
import sys

from zoos.common import IMAGE, Model, image_body, model_file

ZOO = "torchvision"
QUICK = ("mnasnet0_5",)  # its state-dict hook once broke --check
LIST = (
    "import json, sys; sys.path.insert(0, sys.argv[1]); import torchvision.models as m; "
    "print(json.dumps(m.list_models(module=m)))"
)
# name -> (image side, extra keyword arguments); every other model takes 64x64 images as is
SPECIAL: dict[str, tuple[int, str]] = {
    "googlenet": (IMAGE, "aux_logits=False, init_weights=False"),
    "inception_v3": (96, "aux_logits=False, init_weights=False"),  # at least 75x75
    "maxvit_t": (224, ""),  # its windows need 224 (or another multiple of 7 x 32)
    "vit_b_16": (IMAGE, "image_size=64"),
    "vit_b_32": (IMAGE, "image_size=64"),
    "vit_l_16": (IMAGE, "image_size=64"),
    "vit_l_32": (IMAGE, "image_size=64"),
    "vit_h_14": (56, "image_size=56"),  # patches of 14
}


def names(zoo_dir: str) -> list[str]:
    """Every classification model of the installed torchvision (listed in a child process:
    this one never puts ``zoo_dir`` on its path)."""
    done = subprocess.run(
        [sys.executable, "-c", LIST, zoo_dir], capture_output=True, text=True, timeout=300
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"cannot list torchvision's models: {last}")
    return list(json.loads(done.stdout))


def model(name: str, zoo_dir: str) -> Model:
    size, extra = SPECIAL.get(name, (IMAGE, ""))
    kwargs = ", ".join(filter(None, ["weights=None", "num_classes=CLASSES", extra]))
    build = f"import torchvision.models\n\nreturn torchvision.models.get_model({name!r}, {kwargs})"
    return Model(ZOO, name, model_file(ZOO, name, image_body(build, size), zoo_dir))
