"""`${field}` templates of actions (republish's topic and payload): filled from the
rule's output first, then from the input's fields (`${payload.a.b}` reads the JSON
payload). Parsed once when the action is made."""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping

from rules.functions import _text
from rules.record import NotJson, RuleInput

_PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")


def compile_template(text: str, *, key: str) -> Callable[[Mapping[str, Any], RuleInput], str]:
    """A template as a function of (output, input); ValueError naming `key` when a
    placeholder is empty or unclosed."""
    parts: list[str | tuple[str, ...]] = []
    pos = 0
    for match in _PLACEHOLDER.finditer(text):
        name = match.group(1).strip()
        if not name:
            raise ValueError(f"{key}: empty placeholder ${{}} at character {match.start()}")
        parts.append(text[pos:match.start()])
        parts.append(tuple(name.split(".")))
        pos = match.end()
    rest = text[pos:]
    if "${" in rest:
        raise ValueError(f"{key}: unclosed placeholder at character {pos + rest.index('${')}")
    parts.append(rest)
    literal = [p for p in parts if p]
    if all(isinstance(p, str) for p in literal):
        constant = "".join(p for p in literal if isinstance(p, str))
        return lambda output, source: constant

    def render(output: Mapping[str, Any], source: RuleInput) -> str:
        return "".join(p if isinstance(p, str) else _text(lookup(p, output, source)) for p in literal)
    return render


def lookup(path: tuple[str, ...], output: Mapping[str, Any], source: RuleInput) -> Any:
    """A placeholder's value: the output's key (dotted as written, or by path into an
    output value), else the input's field; None when neither has it."""
    dotted = ".".join(path)
    if dotted in output:
        return output[dotted]
    head = path[0]
    if head in output:
        value = output[head]
        for key in path[1:]:
            value = value.get(key) if isinstance(value, dict) else None
        return value
    if head == "payload" and len(path) > 1:
        try:
            value = source.payload_json()
        except NotJson:
            return None
        for key in path[1:]:
            value = value.get(key) if isinstance(value, dict) else None
        return value
    if head == "user_properties" and len(path) > 1:
        return source.user_properties.get(".".join(path[1:]))
    if len(path) == 1 and head in RuleInput.__slots__ and not head.startswith("_"):
        return source.field(head)
    return None
