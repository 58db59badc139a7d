"""Topic access control lists: who may publish to and subscribe to what.

The `acl_file` is TOML, an ordered list of rules; the first rule that matches decides,
and `acl_nomatch` decides when none does:

    acl_nomatch = "deny"            # "allow" (the default) or "deny"

    [[rule]]
    permission = "allow"            # required: "allow" | "deny"
    user = "alice"                  # optional: a user name or a list of them
    client = ["c1", "c2"]           # optional: a client id or a list of them
    ip = "10.0.0.0/8"               # optional: an address or CIDR block, or a list
    action = "publish"              # "publish" | "subscribe" | "all" (the default)
    topics = ["sensors/%u/#", "eq cmd/+"]   # required, non-empty

A rule applies to a client when every condition it gives holds (a missing one holds
for everybody, anonymous clients included). In topics, `%u` is the user name and `%c`
the client id; a topic with `%u` never applies to an anonymous client, and one whose
user name or client id contains `/`, `+` or `#` never applies either, so nobody can
widen a pattern by choosing their name. `eq ` before a topic makes it literal: the
wildcards in it are plain characters to compare, not wildcards.

What "a rule's topic matches" means:
- publish to topic name T: the rule's filter matches T (with `eq`: T equals it).
- subscribe to filter S (the filter inside `$share/group/...` for a shared one):
  an *allow* rule matches when S is covered by the rule's filter, every topic S could
  match is matched by it (`a/+/c` is covered by `a/#`; `a/#` is not covered by
  `a/+`); a *deny* rule matches when S and the rule's filter could match a common
  topic (`#` overlaps `secret/#`). With `eq`, S must equal the text exactly.
This reading is conservative on purpose: when a subscription is granted, every
message it can deliver is one that the same rules would allow the subscriber to read
topic by topic (rules with `eq` aside: they decide only requests for exactly their
text), so no check is needed per delivered message, and retained messages sent on
subscribe obey the rules too. The price: a filter allowed only piecewise by several
rules (`#` with `allow a/#` and `allow b/#`) is refused.

Wills: check `publish` on the will topic at CONNECT (refuse the CONNECT with 0x87, or
drop the will); retained messages published by a client are PUBLISHes like any other.

Rules are compiled once per file; the rules for one client (conditions decided,
`%u`/`%c` substituted) once per client, cached; decisions per topic are cached too,
so the check per PUBLISH is a dict lookup in the common case.
"""

from __future__ import annotations

import ipaddress
import logging
import tomllib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal, Sequence

from mesh.auth import file_signature
from mqtt.errors import TopicFilterInvalid
from mqtt.topics import dollar_blocked as _dollar_blocked
from mqtt.topics import filter_covers, parse_shared_subscription, topic_matches, validate_topic_filter

__all__ = [
    "Acl",
    "AclError",
    "AclFile",
    "AclRule",
    "ClientAcl",
    "Action",
    "filter_covers",
    "filters_overlap",
]

Action = Literal["publish", "subscribe"]
_ACTIONS = ("publish", "subscribe", "all")
_PERMISSIONS = ("allow", "deny")
_RULE_KEYS = frozenset({"permission", "user", "client", "ip", "action", "topics"})
_TOP_KEYS = frozenset({"acl_nomatch", "rule"})
_EQ = "eq "
_PLACEHOLDERS = ("%u", "%c")
_UNSAFE_IN_NAME = ("/", "+", "#")

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

log = logging.getLogger(__name__)


class AclError(ValueError):
    """A bad ACL file: the message names the rule (1-based, in file order) and key."""


# ---------------------------------------------------------------------------------
# Filter algebra (pure; tested against brute force over a finite topic universe);
# `filter_covers` lives in `mqtt.topics` (streams use it too).


def filters_overlap(a: str, b: str) -> bool:
    """Is there a topic name that both filters match?"""
    if _dollar_blocked(a, b):
        return False
    x = a.split("/")
    y = b.split("/")
    for i in range(max(len(x), len(y))):
        p = x[i] if i < len(x) else None
        q = y[i] if i < len(y) else None
        if p == "#" or q == "#":
            return True  # '#' also matches the parent level, so a shorter other is fine
        if p is None or q is None:
            return False
        if p != "+" and q != "+" and p != q:
            return False
    return True


# ---------------------------------------------------------------------------------
# Rules as written in the file


@dataclass(frozen=True)
class _Topic:
    text: str  # without the "eq " prefix, placeholders unsubstituted
    literal: bool
    uses_user: bool
    uses_client: bool


@dataclass(frozen=True)
class AclRule:
    index: int  # 1-based position in the file, for messages
    allow: bool
    users: frozenset[str] | None
    clients: frozenset[str] | None
    networks: tuple[IPNetwork, ...] | None
    publish: bool
    subscribe: bool
    topics: tuple[_Topic, ...]

    def applies_to(self, username: str | None, client_id: str, ip: IPNetwork | None) -> bool:
        if self.users is not None and (username is None or username not in self.users):
            return False
        if self.clients is not None and client_id not in self.clients:
            return False
        if self.networks is not None:
            if ip is None:
                return False
            addr = ip.network_address
            if not any(addr in net for net in self.networks):
                return False
        return True


def _strings(rule: int, key: str, value: object) -> frozenset[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(v, str) for v in items):
        raise AclError(f"rule {rule}: '{key}' must be a string or a non-empty list of strings")
    return frozenset(items)


def _networks(rule: int, value: object) -> tuple[IPNetwork, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(v, str) for v in items):
        raise AclError(f"rule {rule}: 'ip' must be an address/CIDR string or a non-empty list of them")
    nets = []
    for text in items:
        try:
            nets.append(ipaddress.ip_network(text.strip(), strict=True))
        except ValueError as e:
            raise AclError(f"rule {rule}: 'ip' {text!r} is not an address or CIDR block ({e})") from None
    return tuple(nets)


def _topic(rule: int, value: object) -> _Topic:
    if not isinstance(value, str):
        raise AclError(f"rule {rule}: 'topics' entries must be strings, found {value!r}")
    literal = value.startswith(_EQ)
    text = value[len(_EQ):] if literal else value
    if not text:
        raise AclError(f"rule {rule}: 'topics' entry {value!r} is empty")
    uses_user = "%u" in text
    uses_client = "%c" in text
    if not literal:
        # Check the shape with the placeholders filled by a harmless level.
        probe = text.replace("%u", "x").replace("%c", "x")
        try:
            validate_topic_filter(probe)
        except TopicFilterInvalid as e:
            raise AclError(f"rule {rule}: 'topics' entry {value!r} is not a valid topic filter: {e}") from None
        if probe.startswith("$share/") or probe == "$share":
            raise AclError(f"rule {rule}: 'topics' entry {value!r}: write the filter without '$share/group/'; "
                           "shared subscriptions are checked on the filter inside them")
    return _Topic(text, literal, uses_user, uses_client)


def _parse_rule(index: int, raw: object) -> AclRule:
    if not isinstance(raw, dict):
        raise AclError(f"rule {index}: must be a table ([[rule]])")
    unknown = sorted(set(raw) - _RULE_KEYS)
    if unknown:
        raise AclError(f"rule {index}: unknown key '{unknown[0]}' (expected one of {', '.join(sorted(_RULE_KEYS))})")
    permission = raw.get("permission")
    if permission not in _PERMISSIONS:
        raise AclError(f"rule {index}: 'permission' must be \"allow\" or \"deny\", found {permission!r}")
    action = raw.get("action", "all")
    if action not in _ACTIONS:
        raise AclError(f"rule {index}: 'action' must be \"publish\", \"subscribe\" or \"all\", found {action!r}")
    if "topics" not in raw:
        raise AclError(f"rule {index}: 'topics' is required")
    topics = raw["topics"]
    if isinstance(topics, str):
        topics = [topics]
    if not isinstance(topics, list) or not topics:
        raise AclError(f"rule {index}: 'topics' must be a non-empty list of topic filters")
    return AclRule(
        index=index,
        allow=permission == "allow",
        users=_strings(index, "user", raw["user"]) if "user" in raw else None,
        clients=_strings(index, "client", raw["client"]) if "client" in raw else None,
        networks=_networks(index, raw["ip"]) if "ip" in raw else None,
        publish=action in ("publish", "all"),
        subscribe=action in ("subscribe", "all"),
        topics=tuple(_topic(index, t) for t in topics),
    )


def _client_ip(ip: str) -> IPNetwork | None:
    """The client address as a /32 or /128 (IPv4-mapped IPv6 as IPv4); None if unparsable."""
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return ipaddress.ip_network(addr)


# ---------------------------------------------------------------------------------
# Rules for one client


@dataclass(frozen=True)
class _ClientRule:
    allow: bool
    publish: bool
    subscribe: bool
    filters: tuple[str, ...]  # wildcards meaningful
    literals: frozenset[str]  # from "eq " entries


def _substitute(topic: _Topic, username: str | None, client_id: str) -> str | None:
    text = topic.text
    if topic.uses_user:
        if not username or any(c in username for c in _UNSAFE_IN_NAME):
            return None
        text = text.replace("%u", username)
    if topic.uses_client:
        if not client_id or any(c in client_id for c in _UNSAFE_IN_NAME):
            return None
        text = text.replace("%c", client_id)
    return text


class ClientAcl:
    """The rules that apply to one client, substituted; decisions cached per topic."""

    def __init__(self, rules: Sequence[AclRule], nomatch_allow: bool, username: str | None,
                 client_id: str, ip: str, cache_size: int = 1024) -> None:
        net = _client_ip(ip)
        compiled: list[_ClientRule] = []
        for rule in rules:
            if not rule.applies_to(username, client_id, net):
                continue
            filters: list[str] = []
            literals: set[str] = set()
            for topic in rule.topics:
                text = _substitute(topic, username, client_id)
                if text is None:
                    continue
                (literals.add(text) if topic.literal else filters.append(text))
            if filters or literals:
                compiled.append(_ClientRule(rule.allow, rule.publish, rule.subscribe, tuple(filters), frozenset(literals)))
        self._pub_rules = [r for r in compiled if r.publish]
        self._sub_rules = [r for r in compiled if r.subscribe]
        self.nomatch_allow = nomatch_allow
        self._cache_size = cache_size
        self._pub_cache: dict[str, bool] = {}
        self._sub_cache: dict[str, bool] = {}

    @property
    def rule_count(self) -> tuple[int, int]:
        """(publish rules, subscribe rules) that apply to this client."""
        return len(self._pub_rules), len(self._sub_rules)

    def can_publish(self, topic: str) -> bool:
        """May this client publish to topic name `topic`? (Wills and retained too.)"""
        cached = self._pub_cache.get(topic)
        if cached is not None:
            return cached
        decision = self.nomatch_allow
        for rule in self._pub_rules:
            if topic in rule.literals or any(topic_matches(f, topic) for f in rule.filters):
                decision = rule.allow
                break
        self._remember(self._pub_cache, topic, decision)
        return decision

    def can_subscribe(self, topic_filter: str) -> bool:
        """May this client subscribe to `topic_filter` (possibly `$share/g/...`)?"""
        cached = self._sub_cache.get(topic_filter)
        if cached is not None:
            return cached
        try:
            _group, real = parse_shared_subscription(topic_filter)
        except TopicFilterInvalid:
            real = topic_filter  # the broker rejects it anyway; decide on the text
        decision = self.nomatch_allow
        for rule in self._sub_rules:
            if real in rule.literals:
                decision = rule.allow
                break
            if rule.allow:
                hit = any(filter_covers(f, real) for f in rule.filters)
            else:
                hit = any(filters_overlap(f, real) for f in rule.filters)
            if hit:
                decision = rule.allow
                break
        self._remember(self._sub_cache, topic_filter, decision)
        return decision

    def check(self, action: Action, topic_or_filter: str) -> bool:
        if action == "publish":
            return self.can_publish(topic_or_filter)
        if action == "subscribe":
            return self.can_subscribe(topic_or_filter)
        raise ValueError(f"action must be 'publish' or 'subscribe', got {action!r}")

    def _remember(self, cache: dict[str, bool], key: str, decision: bool) -> None:
        if len(cache) >= self._cache_size:
            cache.clear()  # cheap bound; a client cycling through topics just recomputes
        cache[key] = decision


# ---------------------------------------------------------------------------------
# The file


class Acl:
    """A parsed ACL file. `Acl.allow_all()` is what a node without `acl_file` uses."""

    def __init__(self, rules: Sequence[AclRule], nomatch_allow: bool = True, *,
                 source: str = "<acl>", max_clients: int = 10_000) -> None:
        self.rules = tuple(rules)
        self.nomatch_allow = nomatch_allow
        self.source = source
        self._max_clients = max_clients
        self._clients: OrderedDict[tuple[str | None, str, str], ClientAcl] = OrderedDict()

    @classmethod
    def allow_all(cls) -> "Acl":
        return cls((), True, source="<no acl_file>")

    @classmethod
    def from_toml_text(cls, text: str, source: str = "<acl>") -> "Acl":
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise AclError(f"{source}: not valid TOML: {e}") from None
        return cls.from_dict(doc, source)

    @classmethod
    def from_file(cls, path: str) -> "Acl":
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise AclError(f"acl_file {path}: {e.strerror or e}") from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise AclError(f"acl_file {path}: not UTF-8 ({e.reason} at byte {e.start})") from None
        return cls.from_toml_text(text, path)

    @classmethod
    def from_dict(cls, doc: dict[str, object], source: str = "<acl>") -> "Acl":
        unknown = sorted(set(doc) - _TOP_KEYS)
        if unknown:
            raise AclError(f"{source}: unknown key '{unknown[0]}' (expected 'acl_nomatch' and [[rule]] tables)")
        nomatch = doc.get("acl_nomatch", "allow")
        if nomatch not in _PERMISSIONS:
            raise AclError(f"{source}: 'acl_nomatch' must be \"allow\" or \"deny\", found {nomatch!r}")
        raw_rules = doc.get("rule", [])
        if not isinstance(raw_rules, list):
            raise AclError(f"{source}: 'rule' must be an array of tables ([[rule]])")
        try:
            rules = [_parse_rule(i, raw) for i, raw in enumerate(raw_rules, start=1)]
        except AclError as e:
            raise AclError(f"{source}: {e}") from None
        return cls(rules, nomatch == "allow", source=source)

    def for_client(self, username: str | None, client_id: str, ip: str) -> ClientAcl:
        """The compiled rules for one client; cached, so call it per packet freely."""
        key = (username, client_id, ip)
        client = self._clients.get(key)
        if client is not None:
            self._clients.move_to_end(key)
            return client
        client = ClientAcl(self.rules, self.nomatch_allow, username, client_id, ip)
        self._clients[key] = client
        if len(self._clients) > self._max_clients:
            self._clients.popitem(last=False)
        return client

    def forget_client(self, username: str | None, client_id: str, ip: str) -> None:
        self._clients.pop((username, client_id, ip), None)

    def check(self, action: Action, topic_or_filter: str, *, username: str | None,
              client_id: str, ip: str) -> bool:
        """May this client do `action` ("publish" a topic / "subscribe" a filter)?"""
        return self.for_client(username, client_id, ip).check(action, topic_or_filter)

    def __len__(self) -> int:
        return len(self.rules)

    def describe(self) -> str:
        return f"{self.source}: {len(self.rules)} rules, acl_nomatch={'allow' if self.nomatch_allow else 'deny'}"



class AclFile:
    """The `acl_file` setting: the current `Acl`, re-read on SIGHUP or when it changes.

    `AclFile(path)` raises AclError at start, so a node never runs with rules it could
    not read. A later reload that fails keeps the rules in force and logs why: a typo
    saved mid-edit must not open (or close) the whole broker. `AclFile(None)` allows
    everything and never reloads.
    """

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._signature = file_signature(path) if path else None
        self.acl = Acl.from_file(path) if path else Acl.allow_all()
        self.generation = 0  # bumped on each successful reload

    def reload(self) -> bool:
        """Re-read now; True if the new rules are in force."""
        if not self.path:
            return False
        self._signature = file_signature(self.path)
        try:
            acl = Acl.from_file(self.path)
        except AclError as e:
            log.error("%s; the previous rules stay in force (%s)", e, self.acl.describe())
            return False
        self.acl = acl
        self.generation += 1
        log.info("ACL reloaded: %s", acl.describe())
        return True

    def reload_if_changed(self) -> bool:
        """Re-read if mtime, size or inode changed since the last read."""
        if not self.path or file_signature(self.path) == self._signature:
            return False
        return self.reload()
