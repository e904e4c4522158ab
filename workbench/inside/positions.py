"""Which token positions a capture, a logit lens or an intervention covers: one form, one parser.

The same forms everywhere (`capture.positions`, `logit_lens.positions`,
`interventions[i].positions`):

- a word: `"all"` (the default), `"prompt"`, `"generated"`;
- a range, spelled as one: `{"start": 2, "stop": 5}` (positions 2, 3, 4; `stop` left out: to
  the end, `start` left out: from 0), in Python also `range(2, 5)` or `slice(2, 5)`;
- a list of positions, always: `[0, 2, 5]` (`[2, 5]` is the two positions 2 and 5, never a
  range), ascending order not required, no repeats.

Positions are absolute, prompt then generated, from 0. Anything else is refused naming the
exact field (`capture.positions`, `interventions[1].positions`, ...): a 400 over HTTP.

>>> parse_positions({"start": 2, "stop": 5}, "capture.positions").to_json()
{'start': 2, 'stop': 5}
>>> parse_positions([0, 2, 5], "capture.positions").most(10)
3
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.errors import refuse

WORDS = ("all", "prompt", "generated")
FORMS = ("'all', 'prompt', 'generated', a range {\"start\": s, \"stop\": e} (in Python also "
         "range(s, e) or slice(s, e)) or a list of positions such as [0, 2, 5]")


@dataclass(frozen=True)
class Positions:
    """Parsed positions (`parse_positions`): a word, a range [start, stop) or a list."""

    kind: str = "all"  # all | prompt | generated | range | list
    start: int = 0
    stop: int | None = None  # a range's end, excluded; None: to the end of the sequence
    items: tuple[int, ...] = ()  # a list's positions, in the order given

    def selects(self, position: int, num_prompt: int) -> bool:
        """Whether it covers `position` of a sequence whose prompt has `num_prompt` tokens."""
        if self.kind == "all":
            return True
        if self.kind == "prompt":
            return position < num_prompt
        if self.kind == "generated":
            return position >= num_prompt
        if self.kind == "range":
            return position >= self.start and (self.stop is None or position < self.stop)
        return position in self.items

    def most(self, total: int) -> int:
        """An upper bound on how many positions of a sequence of `total` it selects."""
        if self.kind == "range":
            return max(0, min(total, self.stop or total) - self.start)
        if self.kind == "list":
            return len(self.items)
        return total

    def to_json(self) -> Any:
        """The JSON form it was (or could have been) given in."""
        if self.kind == "range":
            return {"start": self.start, "stop": self.stop}
        if self.kind == "list":
            return list(self.items)
        return self.kind


def parse_positions(value: Any, path: str) -> Positions:
    """`value` in one of the forms of the module docstring (None: 'all') -> `Positions`;
    refused naming `path` otherwise."""
    if isinstance(value, Positions):
        return value
    if value is None:
        return Positions()
    if isinstance(value, str):
        if value in WORDS:
            return Positions(value)
        refuse(f"{path}: unknown word {value!r}; positions are {FORMS}.", path, value)
    if isinstance(value, dict):
        return _range(value, path)
    if isinstance(value, range):
        if value.step == 1:
            return _checked_range(value.start, value.stop, path, value)
        if value.step > 0 and len(value):  # range(0, 10, 2): those positions
            return _list(list(value), path)
        refuse(f"{path}: a range's step must be positive, got {value!r}.", path, str(value))
    if isinstance(value, slice):
        if value.step not in (None, 1):
            refuse(f"{path}: a slice of positions takes no step, got {value!r}.", path,
                   str(value))
        for end in (value.start, value.stop):
            if end is not None and not _is_int(end):
                refuse(f"{path}: a slice's start and stop are integers, got {value!r}.", path,
                       str(value))
        return _checked_range(value.start or 0, value.stop, path, value)
    if isinstance(value, (list, tuple)):
        return _list(value, path)
    refuse(f"{path} must be {FORMS}; got {value!r}.", path, value)


def _range(value: dict, path: str) -> Positions:
    unknown = sorted(set(value) - {"start", "stop"})
    if unknown:
        refuse(f"{path}: a range is {{\"start\": s, \"stop\": e}}; unknown key(s) {unknown}.",
               path, unknown)
    start, stop = value.get("start", 0), value.get("stop")
    for key, end in (("start", start), ("stop", stop)):
        if end is not None and not _is_int(end):
            refuse(f"{path}.{key} must be an integer, got {end!r}.", f"{path}.{key}", end)
    return _checked_range(start or 0, stop, path, value)


def _checked_range(start: int, stop: int | None, path: str, given: Any) -> Positions:
    if start < 0 or (stop is not None and stop <= start):
        shown = given if isinstance(given, dict) else str(given)
        refuse(f"{path}: a range [start, stop) needs 0 <= start < stop, got {shown}.", path,
               shown)
    return Positions("range", start, stop)


def _list(value: list | tuple, path: str) -> Positions:
    if not value:
        refuse(f"{path}: an empty list selects no position; use 'all' or list some.", path,
               list(value))
    bad = [v for v in value if not _is_int(v) or v < 0]
    if bad:
        refuse(f"{path}: a list of positions holds integers >= 0, got {bad[0]!r} (a range is "
               "{\"start\": s, \"stop\": e}).", path, list(value))
    if len(set(value)) != len(value):
        refuse(f"{path}: a list of positions names each once, got {list(value)}.", path,
               list(value))
    return Positions("list", items=tuple(value))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
