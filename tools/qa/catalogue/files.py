"""Files that must never be lost: export, plot, --save, --force, --metrics, --trace; disk and
permission errors that name the path."""

from __future__ import annotations

import json
from pathlib import Path

from catalogue.case import (
    COMPILE,
    RUN,
    Case,
    Setup,
    mkdir,
    ran,
    read_only,
    small_disk,
    steps,
    unmount,
    writable,
    write,
)

INDEX = "model.safetensors.index.json"
SHARDS = ("hf/model-00001-of-00002.safetensors", "hf/model-00002-of-00002.safetensors")
HF_FILES = (*SHARDS, f"hf/{INDEX}", "hf/config.json")
SAVED = ran("run", "out", "-q", "--steps", "1", "--save", "ck")
METRICS = ran("run", "out", "-q", "--steps", "1")  # out/metrics.jsonl, for plot


def as_users(path: str) -> Setup:
    """Rewrite the export in ``path`` as a user's ``save_pretrained`` would have written it
    (no pipecompile marker in its shards or index), with a config.json."""

    def run(d: Path) -> None:
        import torch
        from safetensors.torch import load_file, save_file

        for shard in (d / path).glob("model-*.safetensors"):
            tensors: dict[str, torch.Tensor] = load_file(str(shard))
            save_file(tensors, str(shard), metadata={"format": "pt"})
        index = json.loads((d / path / INDEX).read_text())
        index["metadata"] = {"total_size": index["metadata"]["total_size"]}
        (d / path / INDEX).write_text(json.dumps(index))
        (d / path / "config.json").write_text('{"model_type": "mlp"}\n')

    return run


def hf_dir(d: Path) -> None:
    """A user's pretrained weights in hf/: two shards, their index and config.json."""
    steps(ran("export", "out", "-o", "hf", "--shard-size", "40KB"), as_users("hf"))(d)
    assert sorted(p.name for p in (d / "hf").glob("model-*")) == [Path(s).name for s in SHARDS]


def user_safetensors(path: str) -> Setup:
    def run(d: Path) -> None:
        import torch
        from safetensors.torch import save_file

        (d / path).parent.mkdir(parents=True, exist_ok=True)
        save_file({"my.weight": torch.ones(3)}, str(d / path))

    return run


EXPORT_CASES = [
    Case("export-into-hf-dir", "export -o hf/, a user's pretrained weights (shards, index)",
         hf_dir, ("export", "out", "-o", "hf"),
         r"export -o hf: it holds weights pipecompile did not write \(model-00001-of-00002"
         r".*never replaces \(--force or not\); choose another -o", intact=HF_FILES),
    Case("export-into-hf-dir-force", "export -o hf/ --force, a user's pretrained weights",
         hf_dir, ("export", "out", "-o", "hf", "--force"),
         r"export -o hf: it holds weights pipecompile did not write.*choose another -o",
         intact=HF_FILES),
    Case("export-into-weights-dir", "export -o the very directory the compile read --weights from",
         steps(hf_dir, ran("mlp.py", "--stages", "2", "-q", "-o", "tuned", "--weights", "hf")),
         ("export", "tuned", "-o", "hf", "--force"),
         r"export -o hf: it holds weights pipecompile did not write.*choose another -o",
         intact=HF_FILES),
    Case("export-into-own-weights", "export -o the earlier export a compile reads --weights from",
         steps(ran("export", "out", "-o", "hf"),
               ran("mlp.py", "--stages", "2", "-q", "-o", "tuned", "--weights", "hf")),
         ("export", "tuned", "-o", "hf"),
         r"export -o hf: tuned reads its weights from there.*choose another -o",
         intact=("hf/model-00001-of-00001.safetensors", f"hf/{INDEX}")),
    Case("export-foreign-index", "export -o a directory holding only someone's index.json",
         write(f"hf/{INDEX}", '{"weight_map": {}}\n'), ("export", "out", "-o", "hf", "--force"),
         r"did not write \(model\.safetensors\.index\.json\).*choose another -o",
         intact=(f"hf/{INDEX}",)),
    Case("export-foreign-single", "export -o a directory holding a user's model.safetensors",
         user_safetensors("hf/model.safetensors"), ("export", "out", "-o", "hf", "--force"),
         r"did not write \(model\.safetensors\).*choose another -o",
         intact=("hf/model.safetensors",)),
    Case("export-beside-readme", "export -o a directory holding README.md and config.json",
         steps(write("hf/README.md", "# my model\n"), write("hf/config.json", "{}\n")),
         ("export", "out", "-o", "hf"),
         r"holds README\.md, config\.json, which an export did not write; pass --force.*kept",
         intact=("hf/README.md", "hf/config.json")),
    Case("export-beside-readme-force", "export -o a directory holding README.md, with --force",
         steps(write("hf/README.md", "# my model\n"), write("hf/config.json", "{}\n")),
         ("export", "out", "-o", "hf", "--force"),
         r"note: kept README\.md, config\.json in hf.*wrote 10 tensors in 1 shard to hf",
         status=0, intact=("hf/README.md", "hf/config.json")),
    Case("export-again", "export -o the directory an earlier export (4 shards) wrote",
         ran("export", "out", "-o", "hf", "--shard-size", "20KB"), ("export", "out", "-o", "hf"),
         r"wrote 10 tensors in 1 shard to hf", status=0),
    Case("export-file-force", "export -o a user's .safetensors file with --force",
         user_safetensors("mine.safetensors"),
         ("export", "out", "-o", "mine.safetensors", "--force"),
         r"mine\.safetensors: the file exists and pipecompile export did not write it; it is "
         r"never replaced", intact=("mine.safetensors",)),
    Case("export-file-again", "export -o the .safetensors file an earlier export wrote",
         ran("export", "out", "-o", "w.safetensors"), ("export", "out", "-o", "w.safetensors"),
         r"wrote 10 tensors to w\.safetensors", status=0),
    Case("export-read-only", "export -o a directory inside a read-only one",
         read_only("ro"), ("export", "out", "-o", "ro/hf"),
         r"cannot write the export to ro/hf: .*choose a place you can write",
         cleanup=writable("ro")),
    Case("export-file-read-only", "export -o a .safetensors file inside a read-only directory",
         read_only("ro"), ("export", "out", "-o", "ro/w.safetensors"),
         r"cannot write the export to ro/w\.safetensors: ", cleanup=writable("ro")),
    Case("export-full-disk", "export -o a directory on a full disk",
         small_disk("full", "16k"), ("export", "out", "-o", "full/hf"),
         r"cannot write the export to full/hf.*the disk is full", cleanup=unmount("full")),
    Case("export-under-a-file", "export -o a path under an existing file",
         write("notes.txt", "mine"), ("export", "out", "-o", "notes.txt/hf"),
         r"notes\.txt is a file, not a directory", intact=("notes.txt",)),
]  # fmt: skip

COMPILE_CASES = [
    Case("compile-force-users-manifest", "-o webapp/ --force, a folder with its own manifest.json",
         steps(write("webapp/manifest.json", '{"name": "app"}\n'),
               write("webapp/index.html", "hi")),
         (*COMPILE, "-o", "webapp", "--force"),
         r"webapp.*manifest\.json among them under a name it may write; it never replaces them",
         intact=("webapp/manifest.json", "webapp/index.html")),
    Case("compile-force-users-stage", "-o mine/ --force, a folder holding the user's stage_0.py",
         steps(write("mine/stage_0.py", "print('mine')\n"), write("mine/notes.txt", "mine")),
         (*COMPILE, "-o", "mine", "--force"),
         r"stage_0\.py among them under a name it may write.*choose another -o",
         intact=("mine/stage_0.py", "mine/notes.txt")),
    Case("compile-force-new-stage", "recompile out/ into 3 stages --force with a user's "
         "stage_2.py in it", write("out/stage_2.py", "print('mine')\n"),
         (*COMPILE, "-o", "out", "--stages", "3", "--force"),
         r"stage_2\.py among them under a name it may write", intact=("out/stage_2.py",)),
    Case("compile-force-beside", "-o mine/ --force, a folder holding the user's notes.txt",
         write("mine/notes.txt", "mine"), (*COMPILE, "-o", "mine", "--force"),
         r"note: kept notes\.txt in mine", status=0, intact=("mine/notes.txt",)),
    Case("compile-full-disk", "compile -o a directory on a full disk",
         small_disk("full", "32k"), (*COMPILE, "-o", "full/out"),
         r"cannot write output directory full/out: the disk is full", cleanup=unmount("full")),
    Case("compile-read-only", "compile -o a directory inside a read-only one",
         read_only("ro"), (*COMPILE, "-o", "ro/out"), r"ro/out.*(not permitted|permission)",
         cleanup=writable("ro")),
]  # fmt: skip

SAVE_CASES = [
    Case("save-other-run", "run --save ck where an earlier run saved its train state",
         SAVED, (*RUN, "--save", "ck"),
         r"--save ck holds another run's train state \(step_1\).*--resume ck.*--force",
         intact=("ck/step_1/.metadata", "ck/latest")),
    Case("save-resume-same", "run --resume ck --save ck continues the run saved there",
         SAVED, (*RUN, "--steps", "2", "--resume", "ck", "--save", "ck"), r"^$", status=0,
         intact=("ck/step_1/.metadata",)),
    Case("save-force-users-step", "run --save ck --force where ck/step_1/ is the user's",
         write("ck/step_1/notes.txt", "mine"), (*RUN, "--save", "ck", "--force"),
         r"--save ck holds step_1/, which pipecompile did not write.*--force or not",
         intact=("ck/step_1/notes.txt",)),
    Case("save-users-latest", "run --save ck where ck/latest is the user's file",
         write("ck/latest", "my newest notes\n"), (*RUN, "--save", "ck", "--force"),
         r"--save ck holds latest, which pipecompile did not write", intact=("ck/latest",)),
    Case("save-a-file", "run --save naming an existing file", write("notes.txt", "mine"),
         (*RUN, "--save", "notes.txt"), r"cannot write train state to notes\.txt: it is a file",
         intact=("notes.txt",)),
    Case("save-under-a-file", "run --save under an existing file", write("notes.txt", "mine"),
         (*RUN, "--save", "notes.txt/ck"),
         r"cannot write train state to notes\.txt/ck: notes\.txt is a file",
         intact=("notes.txt",)),
    Case("save-read-only", "run --save inside a read-only directory", read_only("ro"),
         (*RUN, "--save", "ro/ck"), r"cannot write train state to ro/ck: ",
         cleanup=writable("ro")),
    Case("save-full-disk", "run --save-every 1 onto a disk that fills up after a few steps",
         small_disk("full", "320k"),
         (*RUN, "--steps", "20", "--save", "full/ck", "--save-every", "1"),
         r"cannot write train state step_\d+ to full/ck: the disk is full.*the last complete "
         r"saved step there is full/ck/step_\d+; step \d+ was saved to \S+ instead: continue "
         r"with --resume", cleanup=unmount("full")),
    Case("save-full-disk-nproc", "run --nproc 2 --save-every 1 onto a disk that fills up",
         small_disk("full", "320k"),
         (*RUN, "--nproc", "2", "--steps", "20", "--save", "full/ck", "--save-every", "1"),
         r"rank \d: error: cannot write train state step_\d+ to full/ck: the disk is full.*"
         r"the last complete saved step there is full/ck/step_\d+", max_lines=4,
         cleanup=unmount("full")),
    Case("run-force-alone", "run --force without --save", steps(), (*RUN, "--force"),
         r"--force lets --save replace another run's train state; drop it"),
]  # fmt: skip

METRICS_CASES = [
    Case("metrics-users-file", "run --metrics naming the user's notes",
         write("notes.txt", "mine\n"), (*RUN, "--metrics", "notes.txt"),
         r"cannot append metrics to notes\.txt: it holds lines pipecompile did not write",
         intact=("notes.txt",)),
    Case("metrics-a-directory", "run --metrics naming a directory", mkdir("logs"),
         (*RUN, "--metrics", "logs"), r"cannot write metrics to logs: it is a directory"),
    Case("metrics-read-only", "run --metrics inside a read-only directory", read_only("ro"),
         (*RUN, "--metrics", "ro/m.jsonl"), r"cannot write metrics to ro/m\.jsonl: ",
         cleanup=writable("ro")),
    Case("metrics-again", "run --metrics naming an earlier run's metrics file",
         ran("run", "out", "-q", "--metrics", "m.jsonl"), (*RUN, "--metrics", "m.jsonl"),
         r"^$", status=0),
    Case("trace-users-file", "run --trace naming the user's own JSON",
         write("notes.json", '{"mine": 1}\n'), (*RUN, "--trace", "notes.json"),
         r"cannot write the trace to notes\.json: the file is not a trace pipecompile wrote",
         intact=("notes.json",)),
    Case("trace-a-directory", "run --trace naming a directory", mkdir("logs"),
         (*RUN, "--trace", "logs"), r"cannot write the trace to logs: it is a directory"),
    Case("measured-not-a-trace", "show --measured naming a JSON file that is no trace",
         write("x.json", "[1]\n"), ("show", "out", "--measured", "x.json"),
         r"x\.json is not a trace `pipecompile run --trace` wrote"),
    Case("measured-other-program", "show --measured with a trace of another directory's run",
         steps(ran("run", "out", "-q", "--trace", "t.json"),
               ran("mlp.py", "--stages", "3", "-q", "-o", "three")),
         ("show", "three", "--measured", "t.json"),
         r"t\.json traced a \w+ program of 2 devices.*but three holds .* of 3"),
    Case("measured-warm-up-only", "show --measured of a trace whose one step is the warm-up",
         ran("run", "out", "-q", "--steps", "1", "--trace", "t.json"),
         ("show", "out", "--measured", "t.json"),
         r"step 1 is the only traced step, the warm-up one .* trace 2 steps or more", status=0),
]  # fmt: skip

PICTURE_CASES = [
    Case("plot-users-file", "plot -o naming the user's own SVG", steps(METRICS,
         write("mine.svg", "<svg>mine</svg>")), ("plot", "out", "-o", "mine.svg"),
         r"plot -o mine\.svg: the file exists and pipecompile plot did not draw it",
         intact=("mine.svg",)),
    Case("plot-users-default", "plot out where out/training.svg is the user's drawing",
         steps(METRICS, write("out/training.svg", "<svg>mine</svg>")), ("plot", "out"),
         r"out/training\.svg: the file exists and pipecompile plot did not draw it",
         intact=("out/training.svg",)),
    Case("plot-again", "plot out twice (its own picture is replaced)",
         steps(METRICS, ran("plot", "out", "-q")), ("plot", "out", "-q"), r"^$", status=0),
    Case("plot-read-only", "plot -o a picture inside a read-only directory",
         steps(METRICS, read_only("ro")), ("plot", "out", "-o", "ro/p.svg"),
         r"cannot write the plot to ro/p\.svg: ", cleanup=writable("ro")),
    Case("viz-read-only", "viz -o a directory inside a read-only one", read_only("ro"),
         ("viz", "out", "-o", "ro/pictures"), r"cannot write pictures to ro/pictures: ",
         cleanup=writable("ro")),
    Case("viz-users-pictures", "viz -o a folder holding the user's own stages.svg and schedule.dot",
         steps(write("figs/stages.svg", "<svg>mine</svg>"), write("figs/schedule.dot", "mine")),
         ("viz", "out", "-o", "figs"),
         r"viz -o figs: stages\.svg, schedule\.dot exist there and pipecompile did not draw",
         intact=("figs/stages.svg", "figs/schedule.dot")),
    Case("viz-full-disk", "viz -o a directory on a full disk", small_disk("full", "4k"),
         ("viz", "out", "-o", "full/pictures"),
         r"cannot write pictures to full/pictures: the disk is full", cleanup=unmount("full")),
]  # fmt: skip

FILES: list[Case] = [*EXPORT_CASES, *COMPILE_CASES, *SAVE_CASES, *METRICS_CASES, *PICTURE_CASES]
