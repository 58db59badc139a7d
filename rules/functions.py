"""The functions a rule's SQL may call, by the name it calls them (lower case).

Each takes its arguments already evaluated. A function of `NULL_IN` gets NULLs (None)
as they are; any other answers NULL when an argument is NULL, as SQL does.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from functools import lru_cache
from typing import Any, Callable


def _round(x: float, digits: int = 0) -> float | int:
    return round(x) if digits == 0 else round(x, int(digits))


def _substr(s: str, start: int, length: int | None = None) -> str:
    """SQL's 1-based SUBSTRING(s, start[, length])."""
    begin = max(int(start) - 1, 0)
    return s[begin:] if length is None else s[begin:begin + int(length)]


def _log(a: float, b: float | None = None) -> float:
    """LOG(x) is the natural log; LOG(base, x) as in PostgreSQL."""
    if b is None:
        return math.log(a)
    return math.log10(b) if a == 10 else math.log2(b) if a == 2 else math.log(b, a)


@lru_cache(maxsize=256)
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _regex_match(s: str, pattern: str) -> bool:
    return _regex(pattern).search(s) is not None


def _regex_replace(s: str, pattern: str, replacement: str) -> str:
    return _regex(pattern).sub(replacement, s)


def _concat(*parts: Any) -> str:
    return "".join(_text(p) for p in parts if p is not None)


def _text(value: Any) -> str:
    """A value as text: JSON for objects and arrays, true/false for booleans."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return "" if value is None else str(value)


def _int(value: Any) -> int:
    return int(float(value)) if isinstance(value, str) else int(value)


def _bool(value: Any) -> bool:
    if isinstance(value, str):
        low = value.strip().lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off", ""):
            return False
        raise ValueError(f"cannot read {value!r} as a boolean")
    return bool(value)


def _topic_level(topic: str, n: int) -> str | None:
    """The n-th level (1-based) of a topic: topic_level('a/b/c', 2) = 'b'."""
    levels = topic.split("/")
    i = int(n)
    return levels[i - 1] if 1 <= i <= len(levels) else None


def _coalesce(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def _nullif(a: Any, b: Any) -> Any:
    return None if a == b else a


def _split(s: str, sep: str) -> list[str]:
    return s.split(sep)


def _md5(s: Any) -> str:
    data = s if isinstance(s, bytes) else _text(s).encode()
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _hex(s: Any) -> str:
    if isinstance(s, int):
        return format(s, "x")
    return (s if isinstance(s, bytes) else _text(s).encode()).hex()


def _position(s: str, sub: str) -> int:
    return s.find(sub) + 1  # 1-based, 0 when absent


def _pad(s: str, width: int, fill: str = " ", left: bool = True) -> str:
    text = _text(s)
    need = int(width) - len(text)
    if need <= 0 or not fill:
        return text[: int(width)]
    padding = (fill * need)[:need]
    return padding + text if left else text + padding


FUNCTIONS: dict[str, Callable[..., Any]] = {
    # math
    "abs": abs, "ceil": math.ceil, "floor": math.floor, "round": _round, "sqrt": math.sqrt,
    "power": math.pow, "exp": math.exp, "ln": math.log, "log": _log, "log10": math.log10, "mod": lambda a, b: a % b,
    "sin": math.sin, "cos": math.cos, "tan": math.tan, "sign": lambda x: (x > 0) - (x < 0),
    "greatest": lambda *xs: max(x for x in xs if x is not None), "least": lambda *xs: min(x for x in xs if x is not None),
    # text
    "lower": str.lower, "upper": str.upper, "trim": str.strip, "ltrim": str.lstrip, "rtrim": str.rstrip,
    "length": len, "substring": _substr, "concat": _concat, "replace": str.replace, "split": _split,
    "reverse": lambda s: s[::-1], "left": lambda s, n: s[: int(n)], "right": lambda s, n: s[-int(n):] if int(n) else "",
    "strpos": _position, "startswith": str.startswith, "contains": lambda s, sub: sub in s,
    "regex_match": _regex_match, "regexp_like": _regex_match, "regex_replace": _regex_replace,
    "regexp_replace": _regex_replace, "lpad": lambda s, n, f=" ": _pad(s, n, f, True),
    "rpad": lambda s, n, f=" ": _pad(s, n, f, False), "md5": _md5, "hex": _hex,
    "topic_level": _topic_level,
    # conversion and NULLs
    "str": _text, "int": _int, "float": float, "bool": _bool,
    "json_encode": lambda v: json.dumps(v, separators=(",", ":")), "json_decode": json.loads,
    "coalesce": _coalesce, "nullif": _nullif,
}

# Functions that take NULL arguments as they are (the others answer NULL for a NULL).
NULL_IN = frozenset({"concat", "coalesce", "nullif", "str", "json_encode", "greatest", "least"})

# Functions that read the clock, which the rule engine binds at construction.
CLOCK_FUNCTIONS = frozenset({"now_timestamp"})
