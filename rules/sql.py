"""A rule's SQL, parsed once with sqlglot and compiled to Python closures over a
`RuleInput`: no parsing or tree walking per message.

    SELECT payload.temp AS t, clientid, topic, timestamp
    FROM "sensors/+/temp", "$events/client_connected"
    WHERE t > 30

Sources are double-quoted: MQTT topic filters, or `$events/<name>`. The WHERE may name
the SELECT's aliases (compiled as the aliased expression). `payload.a.b` reads a JSON
payload by path; `payload` alone is the payload as text. What is refused is refused
at compile time with its position: a parse error (sqlglot's message, line and column),
an unknown function or field, a clause other than SELECT / FROM / WHERE.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Any, Callable

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, SqlglotError

from mqtt.errors import TopicFilterInvalid
from mqtt.topics import validate_topic_filter
from rules.functions import FUNCTIONS, NULL_IN, _text
from rules.record import EVENT_SOURCES, FIELDS, RuleInput

Compiled = Callable[[RuleInput], Any]


class RuleSqlError(ValueError):
    """A rule's SQL refused: `message` says why and where (line and column)."""


@dataclass(frozen=True, slots=True)
class RuleQuery:
    """A compiled rule: its sources and its evaluator."""

    sql: str
    topic_filters: tuple[str, ...]
    events: tuple[str, ...]  # hook point names (`client.connected`) of its $events sources
    columns: tuple[str, ...]  # the output's keys, in SELECT order ("*" for SELECT *)
    evaluate: Callable[[RuleInput], dict[str, Any] | None]  # the output, or None when WHERE does not hold


def compile_rule(sql: str) -> RuleQuery:
    """Parse and compile; raises RuleSqlError with the reason and position."""
    try:
        statements = sqlglot.parse(sql)
    except ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        # sqlglot's column is the offending token's last character: name its first.
        col = first.get("col", 0) - max(len(first.get("highlight") or "") - 1, 0) if first else 0
        at = f" at line {first.get('line')}, column {col}" if first else ""
        description = str(first.get("description", exc)).split("\n")[0]
        raise RuleSqlError(f"cannot parse the rule's SQL{at}: {_tidy(description)}") from None
    except SqlglotError as exc:
        raise RuleSqlError(f"cannot parse the rule's SQL: {exc}") from None
    statements = [s for s in statements if s is not None]
    if len(statements) != 1 or not isinstance(statements[0], exp.Select):
        raise RuleSqlError("a rule is one SELECT ... FROM ... [WHERE ...] statement")
    select = statements[0]
    extra = [key for key, value in select.args.items() if value and key not in ("expressions", "from_", "from", "joins", "where")]
    if extra:
        raise RuleSqlError(f"a rule is SELECT ... FROM ... [WHERE ...]; {extra[0].upper().rstrip('_')} is not supported")
    filters, events = _sources(select)
    compiler = _Compiler()
    columns: list[tuple[str, Compiled]] = []
    star = False
    for item in select.expressions:
        if isinstance(item, exp.Star):
            star = True
            continue
        if isinstance(item, exp.Alias):
            fn = compiler.compile(item.this)
            compiler.aliases[item.alias] = fn
            columns.append((item.alias, fn))
        else:
            columns.append((_column_name(item), compiler.compile(item)))
    where_node = select.args.get("where")
    where = compiler.compile(where_node.this) if where_node is not None else None
    return RuleQuery(sql, filters, events, tuple(["*"] if star else []) + tuple(n for n, _ in columns),
                     _evaluator(columns, star, where))


def _tidy(description: str) -> str:
    # sqlglot names tokens as <Token token_type: TokenType.WHERE, text: WHERE, ...>: say 'WHERE'.
    return re.sub(r"<Token token_type: [^,]+, text: ([^,]*),[^>]*>", r"'\1'", description)


def _evaluator(columns: list[tuple[str, Compiled]], star: bool,
               where: Compiled | None) -> Callable[[RuleInput], dict[str, Any] | None]:
    if star:
        def evaluate_star(c: RuleInput) -> dict[str, Any] | None:
            if where is not None and not where(c):
                return None
            out = c.as_dict()
            for name, fn in columns:
                out[name] = fn(c)
            return out
        return evaluate_star

    if where is None:
        def evaluate_all(c: RuleInput) -> dict[str, Any] | None:
            return {name: fn(c) for name, fn in columns}
        return evaluate_all

    def evaluate(c: RuleInput) -> dict[str, Any] | None:
        if not where(c):
            return None
        return {name: fn(c) for name, fn in columns}
    return evaluate


def _sources(select: exp.Select) -> tuple[tuple[str, ...], tuple[str, ...]]:
    tables: list[exp.Expression] = []
    from_ = select.args.get("from_") or select.args.get("from")
    if from_ is None:
        raise RuleSqlError("a rule needs FROM \"topic/filter\" or FROM \"$events/...\"")
    tables.append(from_.this)
    for join in select.args.get("joins") or ():
        if join.args.get("on") is not None or join.args.get("kind") or join.args.get("side"):
            raise RuleSqlError("sources are listed with commas: FROM \"a/#\", \"b/+\" (no JOIN)")
        tables.append(join.this)
    filters: list[str] = []
    events: list[str] = []
    for table in tables:
        if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier) or table.args.get("db"):
            raise RuleSqlError(f"a source is a double-quoted topic filter or \"$events/...\", not {table.sql()}")
        name = table.this.name
        if name.startswith("$events/"):
            point = EVENT_SOURCES.get(name)
            if point is None:
                raise RuleSqlError(f"unknown event source \"{name}\"{_at(table.this)}; event sources: "
                                   + ", ".join(sorted(EVENT_SOURCES)))
            events.append(point)
            continue
        try:
            if name.startswith("$share/"):
                raise TopicFilterInvalid("a rule reads every message on its filters, not one member's share")
            validate_topic_filter(name)
        except TopicFilterInvalid as exc:
            raise RuleSqlError(f"bad topic filter \"{name}\"{_at(table.this)}: {exc.args[0] if exc.args else exc}") from None
        filters.append(name)
    return tuple(dict.fromkeys(filters)), tuple(dict.fromkeys(events))


def _at(node: exp.Expression) -> str:
    return _start(node.meta)


def _column_name(node: exp.Expression) -> str:
    path = _path(node)
    return ".".join(path) if path is not None else node.sql()


def _path(node: exp.Expression) -> list[str] | None:
    """`payload.a.b` as ["payload", "a", "b"]; None when the node is no field path."""
    if isinstance(node, exp.Column):
        return [part.name for part in node.parts]
    if isinstance(node, exp.Dot) and isinstance(node.expression, exp.Identifier):
        head = _path(node.this)
        return None if head is None else head + [node.expression.name]
    return None


def _walk(value: Any, keys: tuple[str, ...]) -> Any:
    for key in keys:
        if isinstance(value, dict):
            value = value.get(key)
        elif isinstance(value, list) and key.isdigit():
            i = int(key)
            value = value[i] if i < len(value) else None
        else:
            return None
    return value


_COMPARE: dict[type[exp.Expression], Callable[[Any, Any], Any]] = {
    exp.EQ: operator.eq, exp.NEQ: operator.ne, exp.GT: operator.gt, exp.GTE: operator.ge,
    exp.LT: operator.lt, exp.LTE: operator.le,
}
_ARITHMETIC: dict[type[exp.Expression], Callable[[Any, Any], Any]] = {
    exp.Add: operator.add, exp.Sub: operator.sub, exp.Mul: operator.mul, exp.Div: operator.truediv,
    exp.Mod: operator.mod,
}
# sqlglot's typed function nodes, by the name the function table knows them under.
_TYPED: dict[type[exp.Expression], str] = {
    exp.Abs: "abs", exp.Ceil: "ceil", exp.Floor: "floor", exp.Round: "round", exp.Sqrt: "sqrt", exp.Pow: "power",
    exp.Exp: "exp", exp.Ln: "ln", exp.Log: "log", exp.Sin: "sin", exp.Cos: "cos", exp.Tan: "tan", exp.Sign: "sign",
    exp.Greatest: "greatest", exp.Least: "least", exp.Lower: "lower", exp.Upper: "upper", exp.Length: "length",
    exp.Substring: "substring", exp.Concat: "concat", exp.Replace: "replace", exp.Split: "split",
    exp.Reverse: "reverse", exp.Left: "left", exp.Right: "right", exp.StrPosition: "strpos",
    exp.StartsWith: "startswith", exp.Contains: "contains", exp.RegexpLike: "regexp_like", exp.MD5: "md5",
    exp.Hex: "hex", exp.Coalesce: "coalesce", exp.Nullif: "nullif",
}
_CASTS: dict[str, Callable[[Any], Any]] = {
    "INT": FUNCTIONS["int"], "BIGINT": FUNCTIONS["int"], "SMALLINT": FUNCTIONS["int"], "TINYINT": FUNCTIONS["int"],
    "FLOAT": float, "DOUBLE": float, "DECIMAL": float, "TEXT": _text, "VARCHAR": _text, "CHAR": _text,
    "BOOLEAN": FUNCTIONS["bool"],
}


class _Compiler:
    def __init__(self) -> None:
        self.aliases: dict[str, Compiled] = {}  # SELECT aliases the WHERE may name

    def compile(self, node: exp.Expression) -> Compiled:
        method = getattr(self, "_" + type(node).__name__.lower(), None)
        if method is not None:
            fn: Compiled = method(node)
            return fn
        kind = type(node)
        if kind in _COMPARE:
            return self._binary(node, _COMPARE[kind])
        if kind in _ARITHMETIC:
            return self._binary(node, _ARITHMETIC[kind])
        if kind in _TYPED:
            return self._call(_TYPED[kind], node, _arguments(node))
        where = _position(node)
        if isinstance(node, exp.Func):
            raise RuleSqlError(f"unknown function {node.sql_name().lower()}{where}; functions: "
                               + ", ".join(sorted(FUNCTIONS | {"now_timestamp": len})))
        raise RuleSqlError(f"unsupported expression {node.sql()!r}{where}")

    # ------------------------------------------------------------------ leaves

    def _literal(self, node: exp.Literal) -> Compiled:
        value: Any = node.this if node.is_string else _number(node.this)
        return lambda c: value

    def _boolean(self, node: exp.Boolean) -> Compiled:
        value = bool(node.this)
        return lambda c: value

    def _null(self, node: exp.Null) -> Compiled:
        return lambda c: None

    def _paren(self, node: exp.Paren) -> Compiled:
        return self.compile(node.this)

    def _column(self, node: exp.Column) -> Compiled:
        path = _path(node)
        assert path is not None
        return self._field(path, node)

    def _dot(self, node: exp.Dot) -> Compiled:
        path = _path(node)
        if path is None:
            raise RuleSqlError(f"unsupported expression {node.sql()!r}{_position(node)}")
        return self._field(path, node)

    def _field(self, path: list[str], node: exp.Expression) -> Compiled:
        head, rest = path[0], tuple(path[1:])
        if not rest and head in self.aliases:
            return self.aliases[head]
        if head == "payload" and rest:
            return lambda c: _walk(c.payload_json(), rest)
        if head == "user_properties" and rest:
            key = ".".join(rest)
            return lambda c: c.user_properties.get(key)
        if head not in FIELDS:
            raise RuleSqlError(f"unknown field {'.'.join(path)}{_position(node)}; fields: "
                               + ", ".join(sorted(FIELDS)) + ", payload.<path>, user_properties.<name>"
                               + (", and the SELECT's aliases" if self.aliases else ""))
        if rest:
            raise RuleSqlError(f"{head} has no fields ({'.'.join(path)}{_position(node)})")
        if head == "payload":
            return RuleInput.payload_text
        return operator.attrgetter(head)

    # ------------------------------------------------------------------ operators

    def _binary(self, node: exp.Expression, op: Callable[[Any, Any], Any]) -> Compiled:
        a, b = self.compile(node.this), self.compile(node.expression)

        def binary(c: RuleInput) -> Any:
            x = a(c)
            if x is None:
                return None
            y = b(c)
            return None if y is None else op(x, y)
        return binary

    def _dpipe(self, node: exp.DPipe) -> Compiled:
        a, b = self.compile(node.this), self.compile(node.expression)
        return lambda c: _text(a(c)) + _text(b(c))

    def _neg(self, node: exp.Neg) -> Compiled:
        a = self.compile(node.this)

        def neg(c: RuleInput) -> Any:
            x = a(c)
            return None if x is None else -x
        return neg

    def _and(self, node: exp.And) -> Compiled:
        a, b = self.compile(node.this), self.compile(node.expression)
        return lambda c: bool(a(c)) and bool(b(c))

    def _or(self, node: exp.Or) -> Compiled:
        a, b = self.compile(node.this), self.compile(node.expression)
        return lambda c: bool(a(c)) or bool(b(c))

    def _not(self, node: exp.Not) -> Compiled:
        a = self.compile(node.this)
        return lambda c: not a(c)

    def _is(self, node: exp.Is) -> Compiled:
        a = self.compile(node.this)
        if isinstance(node.expression, exp.Null):
            return lambda c: a(c) is None
        b = self.compile(node.expression)
        return lambda c: a(c) is b(c)

    def _in(self, node: exp.In) -> Compiled:
        a = self.compile(node.this)
        items = [self.compile(e) for e in node.expressions]
        if not items:
            raise RuleSqlError(f"IN takes a list of values{_position(node)}")
        if all(isinstance(e, (exp.Literal, exp.Boolean)) for e in node.expressions):
            values = frozenset(item(_NO_INPUT) for item in items)
            return lambda c: a(c) in values
        return lambda c: a(c) in [item(c) for item in items]

    def _between(self, node: exp.Between) -> Compiled:
        a, low, high = self.compile(node.this), self.compile(node.args["low"]), self.compile(node.args["high"])

        def between(c: RuleInput) -> Any:
            x, lo, hi = a(c), low(c), high(c)
            return None if x is None or lo is None or hi is None else lo <= x <= hi
        return between

    def _like(self, node: exp.Like) -> Compiled:
        return self._pattern(node, 0)

    def _ilike(self, node: exp.ILike) -> Compiled:
        return self._pattern(node, re.IGNORECASE)

    def _pattern(self, node: exp.Expression, flags: int) -> Compiled:
        a = self.compile(node.this)
        negate = bool(node.args.get("negate"))
        pattern = node.expression
        if not isinstance(pattern, exp.Literal) or not pattern.is_string:
            raise RuleSqlError(f"LIKE takes a string literal pattern{_position(node)}")
        regex = re.compile("".join(".*" if ch == "%" else "." if ch == "_" else re.escape(ch) for ch in pattern.this),
                           flags | re.DOTALL)

        def like(c: RuleInput) -> Any:
            x = a(c)
            if x is None:
                return None
            return (regex.fullmatch(_text(x)) is None) if negate else (regex.fullmatch(_text(x)) is not None)
        return like

    def _case(self, node: exp.Case) -> Compiled:
        operand = self.compile(node.this) if node.this is not None else None
        branches = [(self.compile(branch.this), self.compile(branch.args["true"])) for branch in node.args["ifs"]]
        default = self.compile(node.args["default"]) if node.args.get("default") is not None else None

        def case(c: RuleInput) -> Any:
            subject = operand(c) if operand is not None else None
            for test, value in branches:
                if (test(c) == subject) if operand is not None else test(c):
                    return value(c)
            return default(c) if default is not None else None
        return case

    def _if(self, node: exp.If) -> Compiled:
        test, yes = self.compile(node.this), self.compile(node.args["true"])
        no = self.compile(node.args["false"]) if node.args.get("false") is not None else None
        return lambda c: yes(c) if test(c) else (no(c) if no is not None else None)

    def _cast(self, node: exp.Cast) -> Compiled:
        target = node.args["to"].this.name if isinstance(node.args["to"], exp.DataType) else ""
        convert = _CASTS.get(target)
        if convert is None:
            raise RuleSqlError(f"cannot CAST to {node.args['to'].sql()}{_position(node)}; types: " + ", ".join(_CASTS))
        a = self.compile(node.this)

        def cast(c: RuleInput) -> Any:
            x = a(c)
            return None if x is None else convert(x)
        return cast

    # ------------------------------------------------------------------ functions

    def _trim(self, node: exp.Trim) -> Compiled:
        position = str(node.args.get("position") or "").upper()
        name = {"LEADING": "ltrim", "TRAILING": "rtrim"}.get(position, "trim")
        return self._call(name, node, [node.this])

    def _pad(self, node: exp.Pad) -> Compiled:
        args = [node.this, node.expression] + ([node.args["fill_pattern"]] if node.args.get("fill_pattern") else [])
        return self._call("lpad" if node.args.get("is_left") else "rpad", node, args)

    def _anonymous(self, node: exp.Anonymous) -> Compiled:
        name = str(node.this).lower()
        if name == "now_timestamp" and not node.expressions:
            return operator.attrgetter("timestamp")
        if name not in FUNCTIONS:
            raise RuleSqlError(f"unknown function {name}{_position(node)}; functions: "
                               + ", ".join(sorted(FUNCTIONS | {"now_timestamp": len})))
        return self._call(name, node, list(node.expressions))

    def _call(self, name: str, node: exp.Expression, arg_nodes: list[exp.Expression]) -> Compiled:
        fn = FUNCTIONS[name]
        args = [self.compile(a) for a in arg_nodes]
        takes_null = name in NULL_IN
        if len(args) == 1:
            (a,) = args

            def call1(c: RuleInput) -> Any:
                x = a(c)
                return None if x is None and not takes_null else fn(x)
            return call1

        def call(c: RuleInput) -> Any:
            values = [a(c) for a in args]
            if not takes_null and None in values:
                return None
            return fn(*values)
        return call


def _arguments(node: exp.Expression) -> list[exp.Expression]:
    """A typed function node's arguments in declaration order (lists flattened)."""
    out: list[exp.Expression] = []
    for key in node.arg_types:
        value = node.args.get(key)
        if isinstance(value, exp.Expression) and not isinstance(value, exp.DataType):
            out.append(value)
        elif isinstance(value, list):
            out.extend(v for v in value if isinstance(v, exp.Expression))
    return out


def _number(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        return float(text)


def _position(node: exp.Expression) -> str:
    for candidate in [node, *node.find_all(exp.Identifier)]:
        at = _start(candidate.meta)
        if at:
            return at
    return ""


def _start(meta: dict[str, Any]) -> str:
    """ " at line L, column C" of a token's first character (sqlglot's `col` is its last)."""
    if "line" not in meta:
        return ""
    col = meta["col"] - (meta["end"] - meta["start"]) if "start" in meta and "end" in meta else meta["col"]
    return f" at line {meta['line']}, column {col}"


_NO_INPUT: Any = None  # constant-folding a literal list reads no input
