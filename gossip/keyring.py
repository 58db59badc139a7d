"""Cluster key: AES-GCM on every gossip packet and frame, with a rotatable keyring.

Sealed format: ``0x01 | key id (4 bytes) | nonce (12) | ciphertext + tag (16)``.
The key id (first bytes of SHA-256 of the key) picks the key to try first; every
key in the ring is accepted so a new key can be installed everywhere, made primary,
and the old one removed later, all without a restart (memberlist's keyring model).
When a ring is set, plaintext is refused: it simply fails to open.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from typing import Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

SEALED_VERSION = 1
NONCE_SIZE = 12
TAG_SIZE = 16
KEY_ID_SIZE = 4
OVERHEAD = 1 + KEY_ID_SIZE + NONCE_SIZE + TAG_SIZE


class DecryptError(Exception):
    """Packet not sealed with any key of the ring (or tampered with)."""


def parse_key(text: str) -> bytes:
    """A cluster key from the command line or environment.

    Base64 of 16, 24 or 32 bytes is used as is (what ``meshd keygen``-style tools
    print); anything else is treated as a passphrase and stretched with scrypt.
    """
    try:
        raw = base64.b64decode(text, validate=True)
        if len(raw) in (16, 24, 32):
            return raw
    except (binascii.Error, ValueError):
        pass
    kdf = Scrypt(salt=b"meshd cluster key v1", length=32, n=2**14, r=8, p=1)
    return kdf.derive(text.encode("utf-8"))


def _key_id(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()[:KEY_ID_SIZE]


class Keyring:
    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise ValueError("a keyring needs at least one key")
        self._keys: list[tuple[bytes, bytes, AESGCM]] = []
        for key in keys:
            self.add(key)

    def add(self, key: bytes) -> None:
        """Install a key (accepted for opening; not used for sealing until `use`)."""
        if len(key) not in (16, 24, 32):
            raise ValueError("AES key must be 16, 24 or 32 bytes")
        if any(k == key for k, _, _ in self._keys):
            return
        self._keys.append((key, _key_id(key), AESGCM(key)))

    def use(self, key: bytes) -> None:
        """Make an installed key the primary (sealing) key."""
        for i, entry in enumerate(self._keys):
            if entry[0] == key:
                self._keys.insert(0, self._keys.pop(i))
                return
        raise KeyError("key is not installed")

    def remove(self, key: bytes) -> None:
        if self._keys and self._keys[0][0] == key:
            raise ValueError("cannot remove the primary key")
        self._keys = [e for e in self._keys if e[0] != key]

    @property
    def primary(self) -> bytes:
        return self._keys[0][0]

    def seal(self, plaintext: bytes, aad: bytes = b"") -> bytes:
        _, kid, aead = self._keys[0]
        nonce = os.urandom(NONCE_SIZE)
        return bytes((SEALED_VERSION,)) + kid + nonce + aead.encrypt(nonce, plaintext, aad)

    def open(self, sealed: bytes, aad: bytes = b"") -> bytes:
        if len(sealed) < OVERHEAD or sealed[0] != SEALED_VERSION:
            raise DecryptError("not a sealed packet")
        kid = sealed[1 : 1 + KEY_ID_SIZE]
        nonce = sealed[1 + KEY_ID_SIZE : 1 + KEY_ID_SIZE + NONCE_SIZE]
        body = sealed[1 + KEY_ID_SIZE + NONCE_SIZE :]
        # the key id is a hint; a collision just means one more try
        for _, k_id, aead in sorted(self._keys, key=lambda e: e[1] != kid):
            try:
                return aead.decrypt(nonce, body, aad)
            except InvalidTag:
                continue
        raise DecryptError("no key in the ring opens this packet")
