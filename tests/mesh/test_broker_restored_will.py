"""A will restored after a crash and the word that another node sent it already
(`Broker.cancel_will`, issue 29): only the restored will is cancelled, not a will the
session got since (the word may come long after: a replica that restarted in between
keeps it on disk and says it when it first sees this node)."""

from __future__ import annotations

from mesh.broker import Broker
from mqtt import Properties, Will
from session_store.store import RecoveredState, StoredSession


def restored_with_will() -> Broker:
    b = Broker(node_id="A")
    will = Will("wills/dev", b"gone", 1, False, Properties(will_delay_interval=0))
    session = StoredSession(client_id="dev", expiry_interval=3600, protocol_level=5, next_seq=1, will=(will, None))
    b.restore(RecoveredState(sessions={"dev": session}), 1000.0, will_grace=5.0)
    return b


def test_the_restored_will_is_cancelled_once() -> None:
    b = restored_with_will()
    assert b.cancel_will("dev")
    assert not b.cancel_will("dev")


def test_a_will_the_session_got_after_the_restore_is_not_cancelled() -> None:
    b = restored_with_will()
    later = Will("wills/dev", b"gone again", 1, False, Properties(will_delay_interval=60))
    b.install_session(StoredSession(client_id="dev", expiry_interval=3600, protocol_level=5, next_seq=1,
                                    will=(later, 1100.0)), now=1010.0)
    assert not b.cancel_will("dev")
    assert "dev" in b._pending_wills
