"""Package-level promises: sans-I/O, the public names, reason-code mappings, buffering."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

import mqtt
from mqtt import (
    Connack,
    Decoder,
    Publish,
    ReasonCode,
    connack_reason_from_v3,
    connack_v3_return_code,
    encode,
)

PACKAGE_DIR = pathlib.Path(mqtt.__file__).parent
FORBIDDEN = {"trio", "socket", "asyncio", "time", "datetime", "selectors", "threading"}


def test_importing_the_codec_pulls_in_no_io():
    code = "import sys, mqtt; print(' '.join(sorted(sys.modules)))"
    repo = PACKAGE_DIR.parent.parent
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, check=True
    )
    loaded = set(out.stdout.split())
    assert "mqtt.decoder" in loaded  # the import really happened
    assert {"trio", "socket", "asyncio", "selectors"} & loaded == set()


def test_sources_import_nothing_that_does_io_or_reads_clocks():
    for path in sorted(PACKAGE_DIR.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"


def test_public_api_is_exported():
    for name in [
        "Decoder", "encode", "patch_publish", "Properties", "EMPTY_PROPERTIES", "ReasonCode",
        "MQTTError", "RemoteProtocolError", "LocalProtocolError", "MalformedPacket",
        "ProtocolError", "PacketTooLarge", "UnsupportedProtocolVersion", "Will", "Connect",
        "Connack", "Publish", "Puback", "Pubrec", "Pubrel", "Pubcomp", "Subscription",
        "Subscribe", "Suback", "Unsubscribe", "Unsuback", "Pingreq", "Pingresp", "Disconnect",
        "Auth", "Packet",
    ]:
        assert hasattr(mqtt, name), name
        assert name in mqtt.__all__


def test_reason_code_values():
    assert ReasonCode.NORMAL_DISCONNECTION == ReasonCode.SUCCESS == 0
    assert ReasonCode.GRANTED_QOS_2 == 2
    assert ReasonCode.NO_SUBSCRIPTION_EXISTED == 0x11
    assert ReasonCode.REAUTHENTICATE == 0x19
    assert ReasonCode.BAD_AUTHENTICATION_METHOD == 0x8C
    assert ReasonCode.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED == 0xA2
    assert len({int(code) for code in ReasonCode}) == 43


@pytest.mark.parametrize(
    ("reason", "v3"),
    [(0x00, 0), (0x84, 1), (0x85, 2), (0x88, 3), (0x89, 3), (0x86, 4), (0x87, 5), (0x8A, 5),
     (0x8C, 5), (0x80, 3), (0x81, 3), (0x82, 3), (0x83, 3), (0x90, 3), (0x95, 3), (0x97, 3),
     (0x9C, 3), (0x9D, 3), (0x9F, 3)],
)
def test_connack_v3_return_code(reason, v3):
    assert connack_v3_return_code(reason) == v3


def test_connack_mapping_round_trips_for_v3_codes():
    for code in range(6):
        assert connack_v3_return_code(connack_reason_from_v3(code)) == code
    with pytest.raises(ValueError):
        connack_reason_from_v3(6)
    with pytest.raises(ValueError):
        connack_v3_return_code(0x10)


def test_many_small_packets_keep_the_buffer_compact():
    one = encode(Publish("t", b"x", qos=1, packet_id=1), 4)
    decoder = Decoder(protocol_level=4)
    chunk = one * 1000
    total = 0
    for _ in range(300):  # 300k packets, ~3 MB in 300 feeds
        decoder.feed(chunk[:-3])
        total += sum(1 for _ in decoder)
        decoder.feed(chunk[-3:])
        total += sum(1 for _ in decoder)
        assert len(decoder._buf) <= 2 * len(chunk) + 64  # consumed bytes do not pile up
    assert total == 300_000
    assert decoder.buffered == 0


def test_large_payload_in_small_chunks():
    payload = bytes(range(256)) * 8192  # 2 MiB
    data = encode(Publish("big", payload), 4)
    decoder = Decoder(protocol_level=4)
    for i in range(0, len(data), 4096):
        decoder.feed(data[i : i + 4096])
        packet = decoder.next_packet()
        if i + 4096 < len(data):
            assert packet is None
    assert packet == Publish("big", payload)


def test_connack_round_trip_in_client_role():
    decoder = Decoder(role="client", protocol_level=5)
    decoder.feed(encode(Connack(True, 0), 5))
    assert decoder.next_packet() == Connack(True, 0)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError):
        Decoder(role="broker")
    with pytest.raises(ValueError):
        Decoder(protocol_level=6)
