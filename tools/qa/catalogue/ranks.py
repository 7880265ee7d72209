"""Under --nproc: ranks that read data agree on each batch, the hook's output is shown, --timeout
bounds every wait."""

from __future__ import annotations

from catalogue.case import RUN, Case, mlp_variant


def hook(source: str) -> tuple[str, str]:
    """An mlp_variant edit adding ``source`` (hooks, helpers) before loss_fn."""
    imports = "import os\nimport random\nimport time"
    return ("def loss_fn(", f"{imports}\n\n\n{source}\n\n\ndef loss_fn(")


def batches(count: int, seed: int = 0) -> str:
    """A list of ``count`` mini-batches drawn from a generator seeded with ``seed``."""
    return (
        f"g = torch.Generator().manual_seed({seed})\n"
        f"    data = [(torch.randn(BATCH_SIZE, IN_FEATURES, generator=g),\n"
        f"             torch.randn(BATCH_SIZE, OUT_FEATURES, generator=g)) for _ in range({count})]"
    )


UNSEEDED_SHUFFLE = hook(
    f"def train_batches():\n    {batches(8)}\n    random.shuffle(data)  # no seed\n    return data"
)
SEEDED_SHUFFLE = hook(
    "_EPOCH = [0]\n\n\n"
    f"def train_batches():\n    {batches(4)}\n"
    "    random.Random(_EPOCH[0]).shuffle(data)  # seeded by the epoch: the same on every rank\n"
    "    _EPOCH[0] += 1\n    return data"
)
SHARDED_BY_RANK = hook(
    f"def train_batches():\n    {batches(8)}\n"
    "    return data[int(os.environ['RANK'])::2]  # as for DistributedDataParallel"
)
UNSEEDED_EVAL = hook(
    f"def train_batches():\n    {batches(2)}\n    return data\n\n\n"
    "def eval_batches():\n    g = torch.Generator()\n"
    "    g.seed()  # from the OS: another on each rank\n"
    "    return [(torch.randn(BATCH_SIZE, IN_FEATURES, generator=g),\n"
    "             torch.randn(BATCH_SIZE, OUT_FEATURES, generator=g)) for _ in range(2)]"
)
BLOCKS_IN_ITERATOR = hook(
    f"def train_batches():\n    {batches(4)}\n    for k, batch in enumerate(data):\n"
    "        if k == 2:\n            time.sleep(1000)  # a queue never filled\n"
    "        yield batch"
)
BLOCKS_IN_CALL = hook(
    f"def train_batches():\n    time.sleep(1000)  # waiting for a download\n    {batches(4)}\n"
    "    return data"
)
BLOCKS_ON_ONE_RANK = hook(
    f"def train_batches():\n    {batches(4)}\n    if os.environ['RANK'] == '1':\n"
    "        time.sleep(1000)  # a lock only rank 0 releases\n    return data"
)
EVAL_BLOCKS = hook(
    f"def train_batches():\n    {batches(2)}\n    return data\n\n\n"
    "def eval_batches():\n    time.sleep(1000)\n    return []"
)
PRINTS = hook(
    f"def train_batches():\n    {batches(3)}\n"
    "    print(f'loading {len(data)} batches')\n    return data"
)
RAISES_ON_ONE_RANK = hook(
    f"def train_batches():\n    {batches(3)}\n    if os.environ['RANK'] == '1':\n"
    "        raise FileNotFoundError('shard-1.bin')\n    return data"
)
RAISES_ON_EVERY_RANK = hook(
    "def train_batches():\n    raise ValueError(f\"no data for rank {os.environ['RANK']}\")"
)
NPROC = ("--model", "model.py", "--nproc", "2")
ON_RANKS = {"max_lines": 4, "own_process": True, "timeout": 240.0}  # a hang must not block
HOOK = r"train_batches\(\) of model\.py"

RANKS = [
    Case("nproc-unseeded-shuffle", "train_batches() shuffles with random, unseeded; --nproc 2",
         mlp_variant(UNSEEDED_SHUFFLE), (*RUN, *NPROC, "--steps", "8"),
         rf"rank \d: error: {HOOK} gave rank 0 and rank 1 different batches at batch \d+ "
         r"\(their shapes or values differ\).*seed its shuffling", **ON_RANKS),
    Case("nproc-data-sharded-by-rank", "train_batches() returns data[RANK::2], as for DDP",
         mlp_variant(SHARDED_BY_RANK), (*RUN, *NPROC, "--steps", "4"),
         rf"rank \d: error: {HOOK} gave rank 0 and rank 1 different batches at batch 0",
         **ON_RANKS),
    Case("nproc-unseeded-eval", "eval_batches() draws unseeded random data; --nproc 2",
         mlp_variant(UNSEEDED_EVAL), (*RUN, *NPROC, "--steps", "2"),
         r"rank \d: error: eval_batches\(\) of model\.py gave rank 0 and rank 1 different "
         r"batches at batch 0", **ON_RANKS),
    Case("nproc-seeded-shuffle", "train_batches() shuffles seeded by the epoch; --epochs 3 (works)",
         mlp_variant(SEEDED_SHUFFLE), (*RUN, *NPROC, "--epochs", "3"), r"^$", status=0,
         **ON_RANKS),
    Case("nproc-hook-blocks", "train_batches() sleeps before its third batch; --timeout 5",
         mlp_variant(BLOCKS_IN_ITERATOR), (*RUN, *NPROC, "--steps", "4", "--timeout", "5"),
         rf"rank \d: error: {HOOK}, batch 2 did not return within --timeout 5 s: the model "
         r"file's code blocks", **ON_RANKS),
    Case("nproc-hook-blocks-in-call", "train_batches() itself sleeps; --timeout 5",
         mlp_variant(BLOCKS_IN_CALL), (*RUN, *NPROC, "--timeout", "5"),
         rf"rank \d: error: {HOOK} did not return within --timeout 5 s", **ON_RANKS),
    Case("nproc-hook-blocks-one-rank", "train_batches() sleeps on rank 1 only; --timeout 5",
         mlp_variant(BLOCKS_ON_ONE_RANK), (*RUN, *NPROC, "--timeout", "5"),
         rf"(?=.*rank 1: error: {HOOK} did not return within --timeout 5 s)"
         rf"(?=.*rank 0: stopping [^:]*: rank 1: {HOOK} did not return)", **ON_RANKS),
    Case("nproc-import-blocks", "the model file sleeps on rank 1 as it is imported; --timeout 5",
         mlp_variant(("import torch\n", "import os\nimport time\n\nimport torch\n\n"
                      "if os.environ.get('RANK') == '1':\n    time.sleep(1000)\n")),
         (*RUN, *NPROC, "--timeout", "5"),
         r"rank 1: error: the model file's import did not return within --timeout 5 s",
         **ON_RANKS),
    Case("nproc-eval-hook-blocks", "eval_batches() sleeps; --timeout 5",
         mlp_variant(EVAL_BLOCKS), (*RUN, *NPROC, "--timeout", "5"),
         r"rank \d: error: eval_batches\(\) of model\.py did not return within --timeout 5 s",
         **ON_RANKS),
    Case("nproc-hook-prints", "train_batches() prints what it loads; --nproc 2 (shown per rank)",
         mlp_variant(PRINTS), (*RUN, *NPROC),
         r"(?m)(?=.*^rank 0: loading 3 batches$)(?=.*^rank 1: loading 3 batches$)", status=0,
         **ON_RANKS),
    Case("nproc-hook-raises-one-rank", "train_batches() raises on rank 1 only",
         mlp_variant(RAISES_ON_ONE_RANK), (*RUN, *NPROC),
         r"(?=.*rank 1: error: model\.py: train_batches\(\) failed: FileNotFoundError: "
         r"shard-1\.bin)(?=.*rank 0: stopping)", **ON_RANKS),
    # A line each: its own error, or (stopped by the first rank's failure before its own
    # hook ran: the launcher stops the others at once) that it stopped
    Case("nproc-hook-raises-every-rank", "train_batches() raises on both ranks (a line each)",
         mlp_variant(RAISES_ON_EVERY_RANK), (*RUN, *NPROC),
         r"(?s)(?=.*rank \d: error: .*ValueError: no data for rank \d)"
         r"(?=.*rank 0: (error: .*ValueError: no data for rank 0|stopping))"
         r"(?=.*rank 1: (error: .*ValueError: no data for rank 1|stopping))", **ON_RANKS),
]  # fmt: skip
