"""Options declared once, as dataclass fields: each field's ``option(...)`` carries its flag,
help, check and default, from which the command line's flags, the namespace's dataclass and
the argv `run --nproc` forwards to each rank are all made.

Example:
    >>> @dataclass
    ... class Flags:
    ...     steps: int | None = option("--steps", check=positive_int, help="steps to run")
    >>> parser = argparse.ArgumentParser(); add_options(parser, Flags)
    >>> to_argv(from_args(Flags, vars(parser.parse_args(["--steps", "3"]))))
    ['--steps', '3']
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pipecompile.ir.records.sizes import parse_size

__all__ = [
    "Option",
    "HONOURED",
    "option",
    "declared",
    "flag_of",
    "add_options",
    "from_args",
    "to_argv",
    "to_record",
    "check_values",
    "from_record",
    "settled",
    "positive_int",
    "count_or_auto",
    "nonnegative_int",
    "positive_float",
    "nonnegative_float",
    "finite_float",
    "size",
]

_KEY = "pipecompile.option"
HONOURED = "honoured"  # ``under_check`` of an option `run --check` takes
T = TypeVar("T")


@dataclass(frozen=True)
class Option:
    """One option's declaration (the metadata of its dataclass field)."""

    flags: tuple[str, ...]  # as the command line spells it; the first long one names it
    help: str
    check: Callable[[str], Any] | None = None  # the command line's text -> the value
    metavar: str | None = None
    choices: Sequence[str] | None = None
    switch: bool = False  # a flag without a value (store_true)
    repeat: bool = False  # may be given several times; the values form a list
    then: Any = None  # taken when not given, once the checks that need "given?" have run
    forwarded: bool = True  # `run --nproc` hands it to every rank (run's options only)
    path: bool = False  # forwarded made absolute (a rank may start elsewhere)
    api: str | None = ""  # the Python API's keyword ("": the field's name; None: none)
    const: Any = None  # the value of the flag given without one (its value is then optional)
    # a training option under `run --check`: HONOURED, or why the check cannot honour it
    under_check: str = ""
    # the mode (a `run` switch's field: "check", "nproc") without which the option applies to
    # nothing, and what it is for there (the refusal says it)
    needs: str = ""
    needs_why: str = ""
    # what it does that `run --nproc` cannot honour ("": nothing); the refusal reads
    # "FLAG <this>; drop it with --nproc"
    under_nproc: str = ""

    @property
    def flag(self) -> str:
        return next((f for f in self.flags if f.startswith("--")), self.flags[0])


def option(
    *flags: str,
    help: str,  # noqa: A002 - argparse's name for it
    default: Any = None,
    required: bool = False,
    **declared: Any,
) -> Any:
    """A dataclass field declaring an option (see ``Option`` for the keywords); ``default``
    is the value when it is not given (None: "not given", told apart from any value; a switch
    is off), and a ``required`` option has none."""
    meta = {_KEY: Option(tuple(flags), help, **declared)}
    if required:
        return dataclasses.field(metadata=meta)
    if declared.get("repeat"):
        return dataclasses.field(default_factory=list, metadata=meta)
    return dataclasses.field(default=False if declared.get("switch") else default, metadata=meta)


def declared(cls: type) -> Iterator[tuple[dataclasses.Field, Option]]:
    """Each field of the options dataclass ``cls`` with its declaration, in order (a field
    declared without ``option``, which no flag sets, is not among them)."""
    for f in dataclasses.fields(cls):
        if _KEY in f.metadata:
            yield f, f.metadata[_KEY]


def flag_of(cls: type, name: str) -> str:
    """The flag of field ``name`` of ``cls``, e.g. ``--save-every``."""
    return next(o.flag for f, o in declared(cls) if f.name == name)


def add_options(parser: argparse.ArgumentParser, cls: type, *, forwarded: bool = False) -> None:
    """Add every field of ``cls`` to ``parser`` (only the forwarded ones if ``forwarded``)."""
    for f, o in declared(cls):
        if forwarded and not o.forwarded:
            continue
        kw: dict[str, Any] = {"dest": f.name, "help": o.help}
        if o.switch:
            kw["action"] = "store_true"
        else:
            kw.update(type=o.check, metavar=o.metavar, choices=o.choices)
            kw["action"] = "append" if o.repeat else "store"
            if o.const is not None:
                kw.update(nargs="?", const=o.const)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kw["required"] = True
        else:
            kw["default"] = [] if o.repeat else f.default
        parser.add_argument(*o.flags, **kw)


def from_args(cls: type[T], parsed: Mapping[str, Any]) -> T:
    """The ``cls`` of the options a parser ``add_options`` built gave (``vars()`` of what it
    parsed: the namespace stays with the surface that parsed it); a field the parser lacks (a
    rank's, for an option not forwarded) keeps its default."""
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    return cls(**{name: parsed[name] for name in names if name in parsed})


def to_argv(options: Any) -> list[str]:
    """``options``' forwarded fields as a rank's arguments: a value given (not None) after its
    flag (a path made absolute), a switch that is on as its flag."""
    out: list[str] = []
    for f, o in declared(type(options)):
        value = getattr(options, f.name)
        if not o.forwarded or value is None or value is False:
            continue
        if o.switch:
            out.append(o.flags[0])
        else:
            for one in value if o.repeat else [value]:
                out += [o.flag, str(Path(one).resolve()) if o.path else str(one)]
    return out


def to_record(options: Any) -> dict[str, Any]:
    """``options``' forwarded fields that are given (not None, not off) as JSON values, a
    path made absolute: what a rank gets instead of argv (``from_record`` reads it back)."""
    out: dict[str, Any] = {}
    for f, o in declared(type(options)):
        value = getattr(options, f.name)
        if not o.forwarded or value is None or value is False:
            continue
        if o.path:
            value = (
                [str(Path(v).resolve()) for v in value] if o.repeat else str(Path(value).resolve())
            )
        out[f.name] = list(value) if o.repeat else value
    return out


def from_record(cls: type[T], record: dict[str, Any]) -> T:
    """The ``cls`` a ``to_record`` dict describes (the fields it lacks not given).

    Raises:
        ValueError: the record names a field ``cls`` does not declare.
    """
    names = {f.name for f, _ in declared(cls)}
    unknown = sorted(set(record) - names)
    if unknown:
        raise ValueError(f"{cls.__name__} declares no option {', '.join(unknown)}")
    return cls(**record)


def check_values(options: Any) -> None:
    """Each given option of ``options`` checked as its flag's text would be (a value that came
    from the command line already was; one given as a keyword, to ``fit()``, had not).

    Raises:
        ValueError: ``argument FLAG: why`` for the first value its declaration refuses.
    """
    for f, o in declared(type(options)):
        value = getattr(options, f.name)
        if value is None or value is False or value == f.default or o.switch or o.repeat:
            continue
        if o.choices is not None and value not in o.choices:
            shown = ", ".join(repr(c) for c in o.choices)
            raise ValueError(f"argument {o.flag}: invalid choice: {value!r} (choose from {shown})")
        if o.check is None:
            continue
        try:
            o.check(str(value))
        except argparse.ArgumentTypeError as err:
            raise ValueError(f"argument {o.flag}: {err}") from None


def settled(options: T) -> T:
    """``options`` with each option not given (None) set to its ``then`` value."""
    later = {
        f.name: o.then
        for f, o in declared(type(options))
        if o.then is not None and getattr(options, f.name) is None
    }
    return dataclasses.replace(options, **later)  # type: ignore[type-var]


def positive_int(text: str) -> int:
    return _number(text, int, lambda v: v >= 1, "a whole number of at least 1")


def count_or_auto(text: str) -> int | str:
    """A whole number of at least 1, or ``auto``."""
    return (
        "auto"
        if text == "auto"
        else _number(text, int, lambda v: v >= 1, "a whole number of at least 1 or auto")
    )


def nonnegative_int(text: str) -> int:
    return _number(text, int, lambda v: v >= 0, "a whole number of at least 0")


def positive_float(text: str) -> float:
    return _number(text, float, lambda v: 0 < v < float("inf"), "a finite number above 0")


def nonnegative_float(text: str) -> float:
    return _number(text, float, lambda v: 0 <= v < float("inf"), "a finite number of at least 0")


def finite_float(text: str) -> float:
    return _number(text, float, lambda v: abs(v) < float("inf"), "a finite number")


def size(text: str) -> int:
    """A byte count such as ``2GiB``."""
    try:
        return parse_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _number(text: str, kind: type, ok: Callable[[Any], bool], want: str) -> Any:
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not {want}")
    return value
