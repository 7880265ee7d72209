"""Every schedule declares its facts in one record beside its generator, and each record says
what its programs do: where stages run, whether backwards split, whether weights update per
micro-batch. The lists the compiler, the plan search and the messages use come from it."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from pipecompile.errors import PlanError, ProgramError
from pipecompile.ir.programs.cost_model import CostModel
from pipecompile.ir.programs.instr import Op
from pipecompile.planner.choose import check_search
from pipecompile.schedules import (
    LOOPED,
    ORDER,
    REGISTRY,
    REPLICABLE,
    SCHEDULES,
    SYNCHRONOUS,
    V_SHAPED,
    compute_program,
    devices_for,
    schedule_of,
)

PACKAGE = Path(importlib.import_module("pipecompile.schedules").__file__).parent
HELPERS = {"__init__", "record", "closed_forms", "list_scheduler", "building_block", "on_graphs"}


def test_every_generator_module_declares_a_registered_record():
    modules = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in HELPERS)
    for stem in modules:
        record = importlib.import_module(f"pipecompile.schedules.{stem}").SCHEDULE
        assert REGISTRY[record.name] is record, stem
    assert len(REGISTRY) == len(modules) == len(SCHEDULES) == len(ORDER)


def _program(name: str, p: int, m: int, v: int = 2):
    record = REGISTRY[name]
    stages = p * record.stages_a_device(v)
    return compute_program(
        name, stages, m, virtual_stages=v if "virtual_stages" in record.takes else None
    )


@pytest.mark.parametrize("name", list(REGISTRY))
@pytest.mark.parametrize(("p", "m"), [(2, 4), (3, 6), (4, 8)])
def test_each_record_says_what_its_programs_do(name, p, m):
    record = REGISTRY[name]
    program = _program(name, p, m)
    assert program.schedule in (record.name, *record.aliases)
    assert schedule_of(program.schedule) is record
    assert len(program.devices) == p == devices_for(name, program.num_stages, 2)
    s = program.num_stages
    expected = {
        "one": tuple(range(s)),
        "looped": tuple(j % p for j in range(s)),
        "v": tuple(j if j < p else 2 * p - 1 - j for j in range(s)),
    }[record.placement]
    assert program.stage_device == expected
    ops = {instr.op for device in program.devices for instr in device}
    assert ({Op.I, Op.W} <= ops) == record.split_backward
    assert (Op.UPDATE in ops) == program.asynchronous == (not record.synchronous)
    # only one stage a device, updated once a step, can be replicated
    assert not record.replicable or (record.placement == "one" and record.synchronous)
    # the weight versions: one a step; an update after each micro-batch (a version per
    # stage); or an update after each window of micro-batches (a version per window)
    updates = sum(instr.op == Op.UPDATE for instr in program.devices[0])
    versions = "step" if not updates else ("stage" if updates == m else "window")
    assert record.weight_versions == versions


def test_the_lists_come_from_the_records():
    assert SYNCHRONOUS == {n for n, s in REGISTRY.items() if s.synchronous}
    assert set(V_SHAPED) == {"zbv", "v_half", "v_min", "dualpipev"}
    assert set(LOOPED) == {"interleaved", "looped_bfs"}
    assert set(REPLICABLE) == {"gpipe", "1f1b", "zb1p", "zb2p"}
    assert ORDER[:2] == ("gpipe", "1f1b") and set(ORDER) == set(REGISTRY)
    assert schedule_of("pipedream-vsync") is REGISTRY["pipedream"]
    with pytest.raises(ProgramError, match="unknown schedule 'nope'; available: gpipe, 1f1b"):
        schedule_of("nope")


def test_an_option_a_schedule_does_not_take_names_those_that_do():
    with pytest.raises(ProgramError, match="--virtual-stages applies to the interleaved and "
                       "looped_bfs schedules, not zbv"):  # fmt: skip
        compute_program("zbv", 4, 4, virtual_stages=2)
    with pytest.raises(ProgramError, match="--vertical-sync applies to the pipedream schedule, "
                       "not 1f1b"):  # fmt: skip
        compute_program("1f1b", 2, 4, vertical_sync=True)
    assert compute_program("pipedream", 2, 4, vertical_sync=True).schedule == "pipedream-vsync"


@pytest.mark.parametrize("name", [n for n, s in REGISTRY.items() if not s.synchronous])
def test_the_search_refuses_each_asynchronous_schedule_by_name(name):
    with pytest.raises(PlanError, match=f"--schedule {name} updates weights asynchronously"):
        check_search(2, None, None, "flops", None, CostModel(), name)


def test_the_docs_list_the_schedules_in_one_place() -> None:
    """A schedule is one file and one page: docs/schedules/README.md links every schedule of
    the registry, and the other pages that once kept their own lists (README, USAGE,
    PLANNING, ARCHITECTURE, API) link to it instead (none names more than three on a line)."""
    import re

    from tests.conftest import ROOT

    index = (ROOT / "docs" / "schedules" / "README.md").read_text()
    assert all(f"[`{name}`]({name}.md)" in index for name in REGISTRY), "a schedule lacks a page"
    names = sorted(REGISTRY, key=len, reverse=True)
    named = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, names)) + r")(?![\w-])")
    pages = ["README.md", *(f"docs/{p}.md" for p in ("USAGE", "PLANNING", "ARCHITECTURE", "API"))]
    for page in pages:
        for number, line in enumerate((ROOT / page).read_text().splitlines(), 1):
            found = set(named.findall(line))
            assert len(found) <= 3, f"{page}:{number} lists schedules by hand: {sorted(found)}"
