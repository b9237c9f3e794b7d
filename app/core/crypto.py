"""Secrets kept encrypted at rest (webhook signing secrets, the answers kept for idempotency
keys, which may show a new API key): Fernet tokens (the
``cryptography`` library: AES-128-CBC with an HMAC-SHA256, a version and a time), under a
``MultiFernet`` of the configured keys, so a rotation is adding a key.

Keys: ``GPUMETER_ENCRYPTION_KEYS``, a JSON list of Fernet keys, newest first: the first
encrypts, every one decrypts. Unset: one key derived (HKDF-SHA256) from
``GPUMETER_SECRET_KEY``, so a deployment encrypts without more configuration.
docs/operations.md ("Rotating the encryption key") says how to rotate.
"""

from __future__ import annotations

import base64
from functools import lru_cache
from typing import Any

from cryptography.fernet import Fernet, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from sqlalchemy import LargeBinary, String
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from app.settings import get_settings

_DERIVED_INFO = b"gpumeter: secrets at rest"


def derived_key(secret_key: str) -> bytes:
    """The Fernet key a signing secret stands for when no encryption key is configured."""
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_DERIVED_INFO)
    return base64.urlsafe_b64encode(hkdf.derive(secret_key.encode()))


@lru_cache(maxsize=4)
def _box(keys: tuple[str, ...], secret_key: str | None) -> MultiFernet:
    if keys:
        return MultiFernet([Fernet(key) for key in keys])
    if not secret_key:
        raise RuntimeError("set GPUMETER_ENCRYPTION_KEYS or GPUMETER_SECRET_KEY")
    return MultiFernet([Fernet(derived_key(secret_key))])


def box() -> MultiFernet:
    """The keys of the current settings."""
    settings = get_settings()
    return _box(tuple(settings.encryption_keys), settings.secret_key)


def encrypt(plain: str) -> str:
    return box().encrypt(plain.encode()).decode("ascii")


def decrypt(token: str) -> str:
    return box().decrypt(token.encode("ascii")).decode()


class EncryptedString(TypeDecorator[str]):
    """A text column stored as a Fernet token: plain in Python, encrypted in the database."""

    impl = String
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else encrypt(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else decrypt(value)


class EncryptedBytes(TypeDecorator[bytes]):
    """A binary column stored as a Fernet token: plain in Python, encrypted in the database."""

    impl = LargeBinary
    cache_ok = True

    def process_bind_param(self, value: bytes | None, dialect: Dialect) -> bytes | None:
        return None if value is None else box().encrypt(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> bytes | None:
        return None if value is None else box().decrypt(bytes(value))
