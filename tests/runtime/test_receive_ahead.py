"""A rank posts its next receives before the instructions that take them."""

from __future__ import annotations

from types import SimpleNamespace

from pipecompile.ir.programs.instr import Instr, Op
from pipecompile.runtime.pipeline import RECEIVE_AHEAD, _receiving_ahead


def test_each_receive_taken_posts_the_one_two_ahead():
    program = [Instr.parse(x) for x in ("1RECV_F0", "1F0", "1RECV_F1", "1F1", "1RECV_B1",
                                        "1B1", "1RECV_B0", "1B0")]  # fmt: skip
    posted: list[str] = []
    backend = SimpleNamespace(post=lambda keys: posted.extend(keys))
    executor = SimpleNamespace(backend=backend, receive_keys=lambda x: [str(x)])
    ran: list[str] = []

    def handler(instr: Instr) -> bool:
        ran.append(str(instr))
        return True

    handlers = _receiving_ahead({op: handler for op in Op}, executor, program)
    assert RECEIVE_AHEAD == 2 and posted == ["1RECV_F0", "1RECV_F1"]  # before the first
    seen = []
    for instr in program:
        handlers[instr.op](instr)
        seen.append((str(instr), list(posted)))
    assert seen[0] == ("1RECV_F0", ["1RECV_F0", "1RECV_F1", "1RECV_B1"])
    assert seen[2] == ("1RECV_F1", ["1RECV_F0", "1RECV_F1", "1RECV_B1", "1RECV_B0"])
    assert posted == [str(x) for x in program if x.op in (Op.RECV_F, Op.RECV_B)]  # each once
    assert ran == [str(x) for x in program]
