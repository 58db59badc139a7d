"""Sans-I/O MQTT 3.1, 3.1.1 and 5.0 codec.

Bytes in, packets out; packets in, bytes out. Nothing here does I/O or reads a clock:

    decoder = Decoder(role="server", max_packet_size=1 << 20)
    decoder.feed(data_from_socket)
    for packet in decoder:              # Connect, Publish, Subscribe, ...
        ...
    data_to_socket = encode(Connack(reason_code=ReasonCode.SUCCESS), decoder.protocol_level)

Packets are dataclasses (values, never changed once built) whose reason codes are always
MQTT 5 values; the codec maps them to and from v3.1.1 at the edge. Errors carry the v5
reason code to answer with: `RemoteProtocolError` when the peer broke the rules (the only
thing the decoder raises), `LocalProtocolError` when we tried to send something invalid.
For fan-out, encode a PUBLISH once and give each subscriber `patch_publish(data,
packet_id=..., dup=...)`, or split it once at its packet id (`split_publish`) and join
each subscriber's id in.

`mqtt.server.ServerConnection` is the server side of one connection on top of the
codec (bytes and `now` in, events out, send methods that return bytes).

The hot modules may be compiled with mypyc (`native`: first, so that the compiled ones,
when in use, are found before the sources below).
"""

import native

native.add_compiled(__path__)

from .decoder import Decoder
from .encoder import encode, patch_publish, split_publish
from .errors import (
    ClientIdentifierNotValid,
    LocalProtocolError,
    MalformedPacket,
    MQTTError,
    PacketTooLarge,
    ProtocolError,
    RemoteProtocolError,
    TopicAliasInvalid,
    TopicFilterInvalid,
    TopicNameInvalid,
    UnsupportedProtocolVersion,
)
from .packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    PacketType,
    Pingreq,
    Pingresp,
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
from .properties import EMPTY_PROPERTIES, Properties
from .reason_codes import ReasonCode, connack_reason_from_v3, connack_v3_return_code
from .topics import (
    parse_shared_subscription,
    topic_matches,
    validate_topic_filter,
    validate_topic_name,
)

__all__ = [
    "Decoder", "encode", "patch_publish", "split_publish",
    "MQTTError", "RemoteProtocolError", "LocalProtocolError", "MalformedPacket",
    "ProtocolError", "PacketTooLarge", "UnsupportedProtocolVersion", "TopicFilterInvalid",
    "TopicNameInvalid", "TopicAliasInvalid", "ClientIdentifierNotValid",
    "Packet", "PacketType", "Will", "Connect", "Connack", "Publish", "Puback", "Pubrec",
    "Pubrel", "Pubcomp", "Subscription", "Subscribe", "Suback", "Unsubscribe", "Unsuback",
    "Pingreq", "Pingresp", "Disconnect", "Auth",
    "Properties", "EMPTY_PROPERTIES",
    "ReasonCode", "connack_v3_return_code", "connack_reason_from_v3",
    "validate_topic_name", "validate_topic_filter", "parse_shared_subscription",
    "topic_matches",
]
