"""Hypothesis strategies for MQTT packets and properties, per protocol level.

They generate only what survives a round trip at that level (e.g. no properties and
only v3-expressible reason codes on 3/4), so `decode(encode(p)) == p` is the property.
"""

from __future__ import annotations

from hypothesis import strategies as st

from mqtt import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
)
from mqtt.properties import ALLOWED_PROPERTIES, EMPTY_PROPERTIES, PROPERTY_IDS
from mqtt.reason_codes import (
    AUTH_REASONS,
    CONNACK_REASONS,
    DISCONNECT_REASONS,
    PUBACK_REASONS,
    PUBREL_REASONS,
    SUBACK_REASONS,
    UNSUBACK_REASONS,
)

# Any Unicode scalar value but U+0000 (surrogates cannot be UTF-8 encoded).
mqtt_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=12,
)
_level_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00/+#"),
    max_size=6,
)
topic_names = st.lists(_level_text, min_size=1, max_size=4).map("/".join).filter(bool)


@st.composite
def topic_filters(draw: st.DrawFn, allow_shared: bool = True) -> str:
    levels = draw(st.lists(st.one_of(_level_text, st.just("+")), min_size=1, max_size=4))
    if levels[0] == "$share":
        levels[0] = "share"  # a plain filter starting with $share would read as a (bad) shared one
    if draw(st.booleans()):
        levels.append("#")
    topic_filter = "/".join(levels)
    if not topic_filter:
        topic_filter = "#"
    if allow_shared and draw(st.integers(0, 4)) == 0:
        group = draw(_level_text.filter(bool))
        topic_filter = f"$share/{group}/{topic_filter}"
    return topic_filter


packet_ids = st.integers(1, 0xFFFF)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
binary = st.binary(max_size=16)
user_properties = st.lists(st.tuples(mqtt_text, mqtt_text), max_size=3).map(tuple)

_VALUES = {
    "payload_format_indicator": st.integers(0, 1),
    "message_expiry_interval": u32,
    "content_type": mqtt_text,
    "response_topic": topic_names,
    "correlation_data": binary,
    "subscription_identifiers": st.lists(st.integers(1, 268_435_455), min_size=1, max_size=3).map(tuple),
    "session_expiry_interval": u32,
    "assigned_client_identifier": mqtt_text,
    "server_keep_alive": u16,
    "authentication_method": mqtt_text,
    "authentication_data": binary,
    "request_problem_information": st.integers(0, 1),
    "will_delay_interval": u32,
    "request_response_information": st.integers(0, 1),
    "response_information": mqtt_text,
    "server_reference": mqtt_text,
    "reason_string": mqtt_text,
    "receive_maximum": st.integers(1, 0xFFFF),
    "topic_alias_maximum": u16,
    "topic_alias": st.integers(1, 0xFFFF),
    "maximum_qos": st.integers(0, 1),
    "retain_available": st.integers(0, 1),
    "user_properties": user_properties,
    "maximum_packet_size": st.integers(1, 0xFFFFFFFF),
    "wildcard_subscription_available": st.integers(0, 1),
    "subscription_identifier_available": st.integers(0, 1),
    "shared_subscription_available": st.integers(0, 1),
}
assert set(_VALUES) == set(PROPERTY_IDS)


def properties(kind: str, level: int = 5, exclude: tuple[str, ...] = ()) -> st.SearchStrategy[Properties]:
    """Properties valid in a packet of `kind` (EMPTY_PROPERTIES below level 5)."""
    if level < 5:
        return st.just(EMPTY_PROPERTIES)
    allowed = ALLOWED_PROPERTIES[kind]
    optional = {
        name: strategy
        for name, strategy in _VALUES.items()
        if PROPERTY_IDS[name] in allowed and name not in exclude
    }
    if kind == "SUBSCRIBE":
        optional["subscription_identifiers"] = st.integers(1, 268_435_455).map(lambda n: (n,))
    return st.fixed_dictionaries({}, optional=optional).map(_with_auth_method).map(lambda d: Properties(**d))


def _with_auth_method(values: dict) -> dict:
    # authentication data needs an authentication method [MQTT-3.1.2.11.10]
    if "authentication_data" in values and "authentication_method" not in values:
        values = {**values, "authentication_method": "method"}
    return values


_V3_CONNACK = (0x00, 0x84, 0x85, 0x86, 0x87, 0x88)  # the codes that survive a v3 round trip


@st.composite
def connects(draw: st.DrawFn, level: int) -> Connect:
    username = draw(st.none() | mqtt_text)
    password = draw(st.none() | binary)
    if level < 5 and username is None:
        password = None  # [MQTT-3.1.2-22]
    will = None
    if draw(st.booleans()):
        will = Will(
            draw(topic_names), draw(binary), draw(st.integers(0, 2)), draw(st.booleans()),
            draw(properties("WILL", level)),
        )
    return Connect(
        client_id=draw(mqtt_text), clean_start=draw(st.booleans()), keep_alive=draw(u16),
        username=username, password=password, will=will,
        properties=draw(properties("CONNECT", level)), protocol_level=level,
    )


@st.composite
def connacks(draw: st.DrawFn, level: int) -> Connack:
    reason = draw(st.sampled_from(sorted(CONNACK_REASONS) if level == 5 else _V3_CONNACK))
    present = draw(st.booleans()) if reason == 0 and level > 3 else False
    return Connack(present, reason, draw(properties("CONNACK", level)))


@st.composite
def publishes(draw: st.DrawFn, level: int, from_server: bool | None = None) -> Publish:
    qos = draw(st.integers(0, 2))
    exclude = () if from_server else ("subscription_identifiers",)
    return Publish(
        topic=draw(topic_names), payload=draw(st.binary(max_size=64)), qos=qos,
        retain=draw(st.booleans()), dup=draw(st.booleans()) if qos else False,
        packet_id=draw(packet_ids) if qos else None,
        properties=draw(properties("PUBLISH", level, exclude)),
    )


def acks(cls: type, kind: str, reasons: frozenset[int], level: int) -> st.SearchStrategy:
    if level < 5:
        return st.builds(cls, packet_ids)
    return st.builds(cls, packet_ids, st.sampled_from(sorted(reasons)), properties(kind))


@st.composite
def subscribes(draw: st.DrawFn, level: int) -> Subscribe:
    subs = []
    for topic_filter in draw(st.lists(topic_filters(), min_size=1, max_size=4)):
        qos = draw(st.integers(0, 2))
        if level < 5:
            subs.append(Subscription(topic_filter, qos))
            continue
        no_local = False if topic_filter.startswith("$share/") else draw(st.booleans())
        subs.append(Subscription(topic_filter, qos, no_local, draw(st.booleans()), draw(st.integers(0, 2))))
    return Subscribe(draw(packet_ids), tuple(subs), draw(properties("SUBSCRIBE", level)))


def subacks(level: int) -> st.SearchStrategy[Suback]:
    codes = sorted(SUBACK_REASONS) if level == 5 else [0, 1, 2, 0x80]
    return st.builds(
        Suback, packet_ids, st.lists(st.sampled_from(codes), min_size=1, max_size=5).map(tuple),
        properties("SUBACK", level),
    )


def unsubscribes(level: int) -> st.SearchStrategy[Unsubscribe]:
    return st.builds(
        Unsubscribe, packet_ids, st.lists(topic_filters(), min_size=1, max_size=4).map(tuple),
        properties("UNSUBSCRIBE", level),
    )


def unsubacks(level: int) -> st.SearchStrategy[Unsuback]:
    if level < 5:
        return st.builds(Unsuback, packet_ids)
    return st.builds(
        Unsuback, packet_ids, st.lists(st.sampled_from(sorted(UNSUBACK_REASONS)), max_size=5).map(tuple),
        properties("UNSUBACK", level),
    )


def disconnects(level: int) -> st.SearchStrategy[Disconnect]:
    if level < 5:
        return st.just(Disconnect())
    return st.builds(Disconnect, st.sampled_from(sorted(DISCONNECT_REASONS)), properties("DISCONNECT"))


def packets(level: int) -> st.SearchStrategy:
    """Any packet that exists at `level`."""
    options = [
        connects(level), connacks(level), publishes(level, from_server=False),
        publishes(level, from_server=True),
        acks(Puback, "PUBACK", PUBACK_REASONS, level), acks(Pubrec, "PUBREC", PUBACK_REASONS, level),
        acks(Pubrel, "PUBREL", PUBREL_REASONS, level), acks(Pubcomp, "PUBCOMP", PUBREL_REASONS, level),
        subscribes(level), subacks(level), unsubscribes(level), unsubacks(level),
        st.just(Pingreq()), st.just(Pingresp()), disconnects(level),
    ]
    if level == 5:
        options.append(st.builds(Auth, st.sampled_from(sorted(AUTH_REASONS)), properties("AUTH")))
    return st.one_of(options)


levels = st.sampled_from((3, 4, 5))


@st.composite
def level_and_packet(draw: st.DrawFn):
    level = draw(levels)
    return level, draw(packets(level))
