"""ACL file parsing and decisions (mesh/acl.py), with references checked by hypothesis."""

from __future__ import annotations

import functools
import itertools
from pathlib import Path
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh.acl import Acl, AclError, Action, filter_covers, filters_overlap
from mqtt.topics import topic_matches, validate_topic_filter

ISSUE_EXAMPLE = """
acl_nomatch = "deny"

[[rule]]
permission = "deny"
action = "all"
topics = ["secret/#"]

[[rule]]
permission = "allow"
user = "admin"
topics = ["#", "$SYS/#"]

[[rule]]
permission = "allow"
action = "publish"
topics = ["devices/%c/telemetry", "users/%u/#"]

[[rule]]
permission = "allow"
action = "subscribe"
topics = ["devices/+/telemetry", "users/%u/#", "eq cmd/#"]

[[rule]]
permission = "allow"
ip = ["10.0.0.0/8", "192.168.1.7"]
action = "publish"
topics = ["lan/#"]
"""


@pytest.fixture
def acl() -> Acl:
    return Acl.from_toml_text(ISSUE_EXAMPLE)


def pub(acl: Acl, topic: str, user: str | None = "alice", client: str = "dev1", ip: str = "127.0.0.1") -> bool:
    return acl.check("publish", topic, username=user, client_id=client, ip=ip)


def sub(acl: Acl, topic_filter: str, user: str | None = "alice", client: str = "dev1", ip: str = "127.0.0.1") -> bool:
    return acl.check("subscribe", topic_filter, username=user, client_id=client, ip=ip)


# --- decisions --------------------------------------------------------------------


def test_first_match_wins(acl: Acl) -> None:
    # The deny rule comes before admin's allow-all.
    assert not pub(acl, "secret/plans", user="admin")
    assert pub(acl, "anything/else", user="admin")
    assert not sub(acl, "secret/#", user="admin")


def test_nomatch_applies_when_no_rule_matches(acl: Acl) -> None:
    assert not pub(acl, "random/topic")
    allow_default = Acl.from_toml_text('[[rule]]\npermission = "deny"\ntopics = ["x"]\n')
    assert pub(allow_default, "random/topic")  # acl_nomatch defaults to allow
    assert not pub(allow_default, "x")


def test_client_id_and_user_substitution(acl: Acl) -> None:
    assert pub(acl, "devices/dev1/telemetry", client="dev1")
    assert not pub(acl, "devices/dev2/telemetry", client="dev1")
    assert pub(acl, "users/alice/inbox/1", user="alice")
    assert not pub(acl, "users/bob/inbox/1", user="alice")


def test_user_pattern_never_applies_to_anonymous(acl: Acl) -> None:
    assert not pub(acl, "users/%u/x", user=None)
    assert not pub(acl, "users//x", user=None)
    assert not sub(acl, "users/+/x", user=None)
    assert pub(acl, "devices/dev1/telemetry", user=None)  # %c still works


@pytest.mark.parametrize("name", ["a/b", "+", "#", "x/#", "a+"])
def test_names_with_wildcards_or_slashes_are_not_substituted(acl: Acl, name: str) -> None:
    """A user called '#' must not get users/#/# = everything under users/."""
    assert not pub(acl, "users/bob/x", user=name)
    assert not pub(acl, f"users/{name}/x", user=name)
    assert not pub(acl, "devices/other/telemetry", client=name)


def test_subscribe_is_allowed_when_a_rule_covers_the_filter(acl: Acl) -> None:
    assert sub(acl, "devices/+/telemetry")
    assert sub(acl, "devices/dev9/telemetry")
    assert sub(acl, "users/alice/#")
    assert sub(acl, "users/alice/+/x")
    assert not sub(acl, "devices/#")  # wider than the rule
    assert not sub(acl, "users/+/#")  # would reach other users
    assert not sub(acl, "#")


def test_deny_rule_blocks_any_overlapping_subscription() -> None:
    rules = Acl.from_toml_text(
        '[[rule]]\npermission = "deny"\ntopics = ["secret/#"]\n'
        '[[rule]]\npermission = "allow"\ntopics = ["#"]\n'
    )
    assert not sub(rules, "#")  # would deliver secret/...
    assert not sub(rules, "+/plans")
    assert not sub(rules, "secret")  # '#' matches the parent level too
    assert sub(rules, "public/#")
    assert sub(rules, "secrets/x")
    assert pub(rules, "public/x") and not pub(rules, "secret/x")


def test_eq_is_a_literal_filter(acl: Acl) -> None:
    assert sub(acl, "cmd/#")
    assert not sub(acl, "cmd/reboot")  # 'eq cmd/#' is not a wildcard
    assert not sub(acl, "cmd/+")
    literal_pub = Acl.from_toml_text('acl_nomatch = "deny"\n[[rule]]\npermission = "allow"\ntopics = ["eq a/b"]\n')
    assert pub(literal_pub, "a/b") and not pub(literal_pub, "a/c")


def test_action_limits_the_rule(acl: Acl) -> None:
    # Rule 3 (publish only) lets a client publish its telemetry ...
    assert pub(acl, "devices/dev1/telemetry")
    # ... rule 4 (subscribe only) lets it subscribe, but not publish others' telemetry.
    assert sub(acl, "devices/dev2/telemetry")
    assert not pub(acl, "devices/dev2/telemetry")
    assert not sub(acl, "lan/x", ip="10.1.2.3")
    assert pub(acl, "lan/x", ip="10.1.2.3")


def test_ip_cidr(acl: Acl) -> None:
    assert pub(acl, "lan/a", ip="10.255.0.1")
    assert pub(acl, "lan/a", ip="192.168.1.7")
    assert pub(acl, "lan/a", ip="::ffff:10.0.0.5")  # IPv4-mapped, as dual-stack sockets report it
    assert not pub(acl, "lan/a", ip="192.168.1.8")
    assert not pub(acl, "lan/a", ip="11.0.0.1")
    assert not pub(acl, "lan/a", ip="")  # unknown address: rules with ip do not apply
    v6 = Acl.from_toml_text('acl_nomatch = "deny"\n[[rule]]\npermission = "allow"\nip = "2001:db8::/32"\ntopics = ["#"]\n')
    assert pub(v6, "x", ip="2001:db8:1::1") and not pub(v6, "x", ip="2001:db9::1")


def test_user_and_client_lists() -> None:
    rules = Acl.from_toml_text(
        'acl_nomatch = "deny"\n[[rule]]\npermission = "allow"\nuser = ["a", "b"]\nclient = "c1"\ntopics = ["t"]\n'
    )
    assert pub(rules, "t", user="a", client="c1")
    assert pub(rules, "t", user="b", client="c1")
    assert not pub(rules, "t", user="b", client="c2")
    assert not pub(rules, "t", user="c", client="c1")
    assert not pub(rules, "t", user=None, client="c1")


def test_dollar_topics_are_not_reached_by_leading_wildcards(acl: Acl) -> None:
    rules = Acl.from_toml_text('acl_nomatch = "deny"\n[[rule]]\npermission = "allow"\ntopics = ["#"]\n')
    assert not pub(rules, "$SYS/broker/load")
    assert not sub(rules, "$SYS/#")
    assert sub(acl, "$SYS/#", user="admin")


def test_shared_subscriptions_are_checked_on_the_inner_filter(acl: Acl) -> None:
    assert sub(acl, "$share/g1/devices/+/telemetry")
    assert not sub(acl, "$share/g1/secret/#", user="admin")
    assert not sub(acl, "$share/g1/#")


def test_unknown_action_is_an_error(acl: Acl) -> None:
    with pytest.raises(ValueError):
        acl.check(cast(Action, "read"), "x", username=None, client_id="c", ip="127.0.0.1")


def test_allow_all() -> None:
    acl = Acl.allow_all()
    assert pub(acl, "a/b") and sub(acl, "#") and len(acl) == 0


def test_decisions_are_cached_per_client_and_bounded(acl: Acl) -> None:
    client = acl.for_client("alice", "dev1", "127.0.0.1")
    assert acl.for_client("alice", "dev1", "127.0.0.1") is client
    assert acl.for_client("alice", "dev2", "127.0.0.1") is not client
    for i in range(3000):
        assert client.can_publish(f"users/alice/{i}")
    assert len(client._pub_cache) <= 1024
    small = Acl(acl.rules, acl.nomatch_allow, max_clients=5)
    for i in range(50):
        small.check("publish", "x", username=None, client_id=f"c{i}", ip="127.0.0.1")
    assert len(small._clients) == 5


def test_from_file(tmp_path: Path) -> None:
    path = tmp_path / "acl.toml"
    path.write_text(ISSUE_EXAMPLE)
    acl = Acl.from_file(str(path))
    assert len(acl) == 5 and not acl.nomatch_allow
    assert "5 rules" in acl.describe()
    with pytest.raises(AclError, match="acl_file .*missing"):
        Acl.from_file(str(tmp_path / "missing"))
    (tmp_path / "bin").write_bytes(b"\xff\xfe")
    with pytest.raises(AclError, match="not UTF-8"):
        Acl.from_file(str(tmp_path / "bin"))


# --- errors in the file -----------------------------------------------------------


def _rule(body: str, extra_rule_before: bool = True) -> str:
    before = '[[rule]]\npermission = "allow"\ntopics = ["ok/#"]\n' if extra_rule_before else ""
    return before + "[[rule]]\n" + body


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (_rule('permission = "allow"\ntopic = ["a"]\n'), r"rule 2: unknown key 'topic'"),
        (_rule('permission = "maybe"\ntopics = ["a"]\n'), r"rule 2: 'permission'"),
        (_rule('topics = ["a"]\n'), r"rule 2: 'permission'"),
        (_rule('permission = "allow"\naction = "read"\ntopics = ["a"]\n'), r"rule 2: 'action'"),
        (_rule('permission = "allow"\n'), r"rule 2: 'topics' is required"),
        (_rule('permission = "allow"\ntopics = []\n'), r"rule 2: 'topics' must be a non-empty"),
        (_rule('permission = "allow"\ntopics = [1]\n'), r"rule 2: 'topics' entries must be strings"),
        (_rule('permission = "allow"\ntopics = ["a/#/b"]\n'), r"rule 2: 'topics' entry 'a/#/b' is not a valid"),
        (_rule('permission = "allow"\ntopics = ["a+"]\n'), r"rule 2: 'topics' entry 'a\+'"),
        (_rule('permission = "allow"\ntopics = ["eq "]\n'), r"rule 2: 'topics' entry 'eq ' is empty"),
        (_rule('permission = "allow"\ntopics = ["$share/g/a"]\n'), r"rule 2: .*\$share"),
        (_rule('permission = "allow"\nip = "10.0.0.1/8"\ntopics = ["a"]\n'), r"rule 2: 'ip' '10.0.0.1/8'"),
        (_rule('permission = "allow"\nip = "nonsense"\ntopics = ["a"]\n'), r"rule 2: 'ip' 'nonsense'"),
        (_rule('permission = "allow"\nip = 10\ntopics = ["a"]\n'), r"rule 2: 'ip' must be"),
        (_rule('permission = "allow"\nuser = 5\ntopics = ["a"]\n'), r"rule 2: 'user' must be"),
        (_rule('permission = "allow"\nclient = []\ntopics = ["a"]\n'), r"rule 2: 'client' must be"),
        ('acl_nomatch = "perhaps"\n', r"'acl_nomatch' must be"),
        ('rules = []\n', r"unknown key 'rules'"),
        ('rule = "x"\n', r"'rule' must be an array of tables"),
        ('rule = ["x"]\n', r"rule 1: must be a table"),
        ('[[rule]\n', r"not valid TOML"),
    ],
)
def test_bad_files_name_the_rule_and_key(text: str, message: str) -> None:
    with pytest.raises(AclError, match=message):
        Acl.from_toml_text(text, source="acl.toml")
    with pytest.raises(AclError, match=r"^acl\.toml: "):
        Acl.from_toml_text(text, source="acl.toml")


def test_single_string_topics_and_default_action() -> None:
    acl = Acl.from_toml_text('acl_nomatch = "deny"\n[[rule]]\npermission = "allow"\ntopics = "a/+"\n')
    assert pub(acl, "a/b") and sub(acl, "a/b") and sub(acl, "a/+")


# --- filter algebra against brute force -------------------------------------------

LEVELS = ["a", "b", "$x", ""]
FRESH = "z"  # a level no filter names
UNIVERSE = [
    "/".join(levels)
    for depth in range(1, 6)
    for levels in itertools.product(LEVELS + [FRESH], repeat=depth)
]


@st.composite
def filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(st.sampled_from(LEVELS + ["+"]), min_size=0, max_size=4))
    if not levels or draw(st.booleans()):
        levels = levels[:3] + ["#"]
    text = "/".join(levels) or "a"  # [""] would be the empty filter
    validate_topic_filter(text)
    return text


@functools.lru_cache(maxsize=None)
def matched(topic_filter: str) -> frozenset[str]:
    return frozenset(t for t in UNIVERSE if topic_matches(topic_filter, t))


@settings(max_examples=300, deadline=None)
@given(filters(), filters())
def test_filter_covers_matches_brute_force(outer: str, inner: str) -> None:
    assert filter_covers(outer, inner) == (matched(inner) <= matched(outer))


@settings(max_examples=300, deadline=None)
@given(filters(), filters())
def test_filters_overlap_matches_brute_force(a: str, b: str) -> None:
    assert filters_overlap(a, b) == bool(matched(a) & matched(b))
    assert filters_overlap(a, b) == filters_overlap(b, a)


@pytest.mark.parametrize(
    ("outer", "inner", "covers", "overlap"),
    [
        ("#", "a/b", True, True),
        ("a/#", "a", True, True),
        ("a/+", "a", False, False),
        ("a/+", "a/#", False, True),
        ("+/+", "a/+", True, True),
        ("#", "$SYS/#", False, False),
        ("+/x", "$SYS/x", False, False),
        ("$SYS/#", "$SYS/+", True, True),
        ("a/b", "a/b", True, True),
        ("a/b", "a/c", False, False),
    ],
)
def test_filter_algebra_table(outer: str, inner: str, covers: bool, overlap: bool) -> None:
    assert filter_covers(outer, inner) is covers
    assert filters_overlap(outer, inner) is overlap


# --- ACL decisions against a plain reference --------------------------------------

USERS = [None, "a", "b"]


@st.composite
def rule_texts(draw: st.DrawFn, allow_eq: bool) -> tuple[dict, str]:
    permission = draw(st.sampled_from(["allow", "deny"]))
    action = draw(st.sampled_from(["publish", "subscribe", "all"]))
    topics = []
    for _ in range(draw(st.integers(1, 3))):
        topic = draw(filters())
        if draw(st.integers(0, 3)) == 0:
            topic = topic.replace("a", "%u", 1)
        if allow_eq and draw(st.integers(0, 4)) == 0:
            topic = "eq " + topic
        topics.append(topic)
    rule: dict = {"permission": permission, "action": action, "topics": topics}
    user = draw(st.sampled_from([None, "a", "b"]))
    if user is not None:
        rule["user"] = user
    lines = ["[[rule]]"] + [f"{k} = {v!r}".replace("'", '"') for k, v in rule.items()]
    return rule, "\n".join(lines) + "\n"


@st.composite
def acls(draw: st.DrawFn, allow_eq: bool = True) -> tuple[list[dict], bool, str]:
    rules = draw(st.lists(rule_texts(allow_eq), max_size=5))
    nomatch_allow = draw(st.booleans())
    text = f'acl_nomatch = "{"allow" if nomatch_allow else "deny"}"\n' + "".join(t for _, t in rules)
    return [r for r, _ in rules], nomatch_allow, text


def reference_topic_decision(rules: list[dict], nomatch_allow: bool, action: str, topic: str, user: str | None) -> bool:
    """First rule whose (substituted) topic matches the topic name decides."""
    for rule in rules:
        if rule["action"] not in (action, "all"):
            continue
        if "user" in rule and rule["user"] != user:
            continue
        for entry in rule["topics"]:
            literal = entry.startswith("eq ")
            text = entry[3:] if literal else entry
            if "%u" in text:
                if user is None:
                    continue
                text = text.replace("%u", user)
            if (topic == text) if literal else topic_matches(text, topic):
                return rule["permission"] == "allow"
    return nomatch_allow


@settings(max_examples=300, deadline=None)
@given(acls(), st.sampled_from(USERS), st.sampled_from(UNIVERSE))
def test_publish_matches_reference(spec: tuple[list[dict], bool, str], user: str | None, topic: str) -> None:
    rules, nomatch_allow, text = spec
    acl = Acl.from_toml_text(text)
    expected = reference_topic_decision(rules, nomatch_allow, "publish", topic, user)
    assert pub(acl, topic, user=user) is expected


@settings(max_examples=300, deadline=None)
@given(acls(allow_eq=False), st.sampled_from(USERS), filters())
def test_granted_subscription_only_delivers_allowed_topics(spec: tuple[list[dict], bool, str], user: str | None, topic_filter: str) -> None:
    """The soundness of the subscribe rule: every topic a granted filter can deliver is
    one the same rules allow topic by topic."""
    rules, nomatch_allow, text = spec
    acl = Acl.from_toml_text(text)
    if sub(acl, topic_filter, user=user):
        for topic in matched(topic_filter):
            assert reference_topic_decision(rules, nomatch_allow, "subscribe", topic, user), topic


@settings(max_examples=300, deadline=None)
@given(acls(allow_eq=False), st.sampled_from(USERS), st.sampled_from(UNIVERSE))
def test_subscribe_to_a_plain_topic_matches_reference(spec: tuple[list[dict], bool, str], user: str | None, topic: str) -> None:
    """For a filter without wildcards, 'covers' and 'overlaps' both mean 'matches'."""
    rules, nomatch_allow, text = spec
    acl = Acl.from_toml_text(text)
    expected = reference_topic_decision(rules, nomatch_allow, "subscribe", topic, user)
    assert sub(acl, topic, user=user) is expected


# --- AclFile: reload on change ----------------------------------------------------


def test_acl_file_reload(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import logging
    import os

    from mesh.acl import AclFile

    path = tmp_path / "acl.toml"
    path.write_text('acl_nomatch = "deny"\n[[rule]]\npermission = "allow"\ntopics = ["a/#"]\n')
    watched = AclFile(str(path))
    assert pub(watched.acl, "a/x") and not pub(watched.acl, "b/x")
    assert watched.reload_if_changed() is False
    path.write_text('acl_nomatch = "deny"\n[[rule]]\npermission = "allow"\ntopics = ["b/#", "c"]\n')
    assert watched.reload_if_changed() is True and watched.generation == 1
    assert pub(watched.acl, "b/x") and not pub(watched.acl, "a/x")
    # A broken edit keeps the rules in force and says why.
    caplog.set_level(logging.ERROR, logger="mesh.acl")
    path.write_text('[[rule]]\npermission = "alow"\ntopics = ["#"]\n')
    assert watched.reload_if_changed() is False
    assert "rule 1: 'permission'" in caplog.text and "previous rules stay in force" in caplog.text
    assert pub(watched.acl, "b/x") and not pub(watched.acl, "a/x")
    assert watched.reload_if_changed() is False  # not retried until the file changes again
    os.unlink(path)
    assert watched.reload() is False and pub(watched.acl, "b/x")
    # At start a bad file is an error, not an open broker.
    with pytest.raises(AclError):
        AclFile(str(path))
    unset = AclFile(None)
    assert pub(unset.acl, "anything") and unset.reload() is False and unset.reload_if_changed() is False
