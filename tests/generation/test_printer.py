"""`pipecompile generate` streams one sequence's text decoded whole: a character whose bytes
come in two tokens is printed once both have come, never as a replacement character."""

from __future__ import annotations

from pipecompile.surfaces.generate_command import _Printer


def _utf8(ids: list[int]) -> str:
    return bytes(ids).decode("utf-8", errors="replace")


def test_a_character_cut_in_two_tokens_waits_for_its_second(capsys):
    prompt = list(b"caf")
    show = _Printer([prompt], _utf8, 4, (), quiet=False)
    show.begin()
    assert capsys.readouterr().out == "caf"
    show.token(0, 0xC3)  # the first byte of é
    assert capsys.readouterr().out == ""
    show.token(0, 0xA9)
    assert capsys.readouterr().out == "é"
    show.token(0, ord("!"))
    show.token(0, 0xC3)  # cut short by the end of the sequence: shown as what it is
    show.end({0: [0xC3, 0xA9, ord("!"), 0xC3]})
    assert capsys.readouterr().out == "!\ufffd\n"


def test_token_ids_without_a_decoder(capsys):
    show = _Printer([[1, 2]], None, 2, (), quiet=True)
    show.begin()
    show.token(0, 7)
    show.token(0, 9)
    show.end({0: [7, 9]})
    printed = capsys.readouterr()
    assert (printed.out, printed.err) == ("7 9 \n", "")  # -q: no rate line
