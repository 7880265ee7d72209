"""What a job is checked against before it starts, whichever door starts it: faults that
could never fire (``PIPECOMPILE_FAULT``), generation's `--timeout` and sampling, and a model
file edited after compiling (`generate`, `export`). tests/test_doors.py gives the run's cases of
the catalogue to every door (`run`, ``fit()``, the worker under torchrun) as well."""

from __future__ import annotations

from catalogue.case import RUN, Case, edit, nothing, ran

FAULT = "PIPECOMPILE_FAULT"
NPROC = ("--nproc", "2", "--steps", "3")
GEN = ("generate", "out", "-q", "--prompt-ids", "1,2,3")
NEVER = "PIPECOMPILE_FAULT {} could never fire: "

DOORS = [
    Case("fault-rank-beyond", "PIPECOMPILE_FAULT=5:2:1B0:kill with 2 ranks", nothing,
         (*RUN, *NPROC), NEVER.format("5:2:1B0:kill") + "this run has ranks 0 to 1",
         env=((FAULT, "5:2:1B0:kill"),)),
    Case("fault-no-such-instruction", "PIPECOMPILE_FAULT=1:2:9B9:kill (no instruction 9B9)",
         nothing, (*RUN, *NPROC),
         NEVER.format("1:2:9B9:kill") + r"rank 1 runs device 1, whose program has no "
         r"instruction 9B9 \(it runs .*1F0.*program\.txt lists every device's\)",
         env=((FAULT, "1:2:9B9:kill"),)),
    Case("fault-after-the-last-step", "PIPECOMPILE_FAULT=1:9:1B0:kill with --steps 3", nothing,
         (*RUN, *NPROC), NEVER.format("1:9:1B0:kill") + r"the run ends at step 3 \(--steps 3\)",
         env=((FAULT, "1:9:1B0:kill"),)),
    Case("fault-instruction-one-process", "PIPECOMPILE_FAULT=0:1:0F0:kill without --nproc",
         nothing, RUN,
         NEVER.format("0:1:0F0:kill") + r"faults at instructions fire on the ranks of --nproc N, "
         r"and this run is one process; add --nproc, or set 0:1:save:kill for a save",
         env=((FAULT, "0:1:0F0:kill"),)),
    Case("fault-save-without-save", "PIPECOMPILE_FAULT=0:2:save:disk, and the run saves nothing",
         nothing, (*RUN, *NPROC),
         NEVER.format("0:2:save:disk") + r"this run saves nothing; add --save DIR",
         env=((FAULT, "0:2:save:disk"),)),
    Case("fault-save-not-saved", "PIPECOMPILE_FAULT=0:3:save:kill, --save-every 2 --steps 4",
         nothing, (*RUN, "--nproc", "2", "--steps", "4", "--save", "ck", "--save-every", "2"),
         NEVER.format("0:3:save:kill") + r"the run saves every 2 steps \(--save-every\), never "
         r"after step 3", env=((FAULT, "0:3:save:kill"),)),
    Case("fault-before-the-resumed-step", "PIPECOMPILE_FAULT=1:2:1B0:kill, --resume at step 3",
         ran("run", "out", "-q", "--steps", "3", "--save", "ck"),
         (*RUN, *NPROC[:2], "--steps", "5", "--resume", "ck"),
         NEVER.format("1:2:1B0:kill") + r"the run resumes after step 3, so its first step is 4",
         env=((FAULT, "1:2:1B0:kill"),)),
    Case("fault-unreadable", "PIPECOMPILE_FAULT=1:oops", nothing, (*RUN, *NPROC),
         r"PIPECOMPILE_FAULT: cannot read '1:oops': write RANK:STEP:WHERE:KIND",
         env=((FAULT, "1:oops"),)),
    Case("generate-fault-rank-0", "PIPECOMPILE_FAULT=0:3:turn:kill for generate --nproc 2",
         nothing, (*GEN, "--nproc", "2"),
         NEVER.format("0:3:turn:kill") + r"turns are taken by ranks 1 to 1 \(rank 0 is this "
         r"process, which leads\)", base="gpt", env=((FAULT, "0:3:turn:kill"),)),
    Case("generate-fault-one-process", "PIPECOMPILE_FAULT=1:3:turn:kill, generate without --nproc",
         nothing, GEN, NEVER.format("1:3:turn:kill") + r"this generation runs in one process",
         base="gpt", env=((FAULT, "1:3:turn:kill"),)),
    Case("generate-fault-at-instruction", "PIPECOMPILE_FAULT=1:2:1F0:kill for generate --nproc 2",
         nothing, (*GEN, "--nproc", "2"),
         NEVER.format("1:2:1F0:kill") + r"generation fails a rank at a turn", base="gpt",
         env=((FAULT, "1:2:1F0:kill"),)),
    Case("generate-timeout-without-nproc", "generate --timeout 5 in one process", nothing,
         (*GEN, "--timeout", "5"),
         r"--timeout 5 bounds how long rank 0 waits for the other ranks' tokens, and a "
         r"generation in one process waits on none; drop it, or add --nproc N", base="gpt"),
    Case("generate-temperature-nan", "generate --temperature nan", nothing,
         (*GEN, "--temperature", "nan"),
         r"--temperature nan: give 0 \(greedy\) or a finite number above 0", base="gpt"),
    Case("generate-negative-new-tokens", "generate --max-new-tokens -3", nothing,
         (*GEN, "--max-new-tokens", "-3"), r"--max-new-tokens -3: give 0 or more new tokens",
         base="gpt"),
    Case("generate-stale", "changed gpt.py's head count (2 -> 4) after compiling, then generate",
         edit("gpt.py", "n_head: int = 4", "n_head: int = 2"), GEN,
         r"out is stale: .*gpt\.py changed after it was compiled.*recompile \(`pipecompile "
         r".*gpt\.py:build_model --stages 2 --schedule gpipe --microbatches 1 --generate -o "
         r"out`\), or pass --allow-stale", base="gpt"),
    Case("export-stale", "changed mlp.py after compiling, then export", edit(
         "mlp.py", "def build_model", "# edited\n\n\ndef build_model"),
         ("export", "out", "-o", "w.safetensors"),
         r"out is stale: .*mlp\.py changed after it was compiled.*pass --allow-stale to export"),
    Case("show-allow-stale-alone", "show --allow-stale without --measured", nothing,
         ("show", "out", "--allow-stale"), r"--allow-stale lets --measured compare"),
]  # fmt: skip
