"""TLS file checks shared by the broker's listener (:mod:`oncelog.broker.security`) and the client
(:mod:`oncelog.client.security`); like the rest of :mod:`oncelog.protocol` it imports nothing of ours.

Each caller words its own errors (Kafka's key names on the broker, librdkafka's on the client): these
helpers take the exception to raise, or raise :class:`KeyNeedsPassword` for the caller to translate.
"""

from __future__ import annotations

import os
from collections.abc import Callable

__all__ = ["KeyNeedsPassword", "key_password", "readable"]


class KeyNeedsPassword(Exception):
    """``SSLContext.load_cert_chain`` met an encrypted private key and no password is configured."""


def _no_key_password() -> str:
    """The password callback when none is configured: without one OpenSSL would prompt on the terminal
    ("Enter PEM pass phrase:") for an encrypted key, then fail with a bare OSError."""
    raise KeyNeedsPassword


def key_password(password: str | None) -> str | Callable[[], str]:
    """The ``password`` argument for ``SSLContext.load_cert_chain``: the configured password, or a callback
    that raises :class:`KeyNeedsPassword` instead of prompting on the terminal."""
    return password if password is not None else _no_key_password


def readable(path: str, error: Callable[[str], Exception], missing: str) -> str:
    """``path`` if it is a file this process may read; otherwise raises ``error(why)``, where ``why`` is
    ``missing`` (not a file) or "cannot be read (permission denied)"."""
    if not os.path.isfile(path):
        raise error(missing)
    if not os.access(path, os.R_OK):
        raise error("cannot be read (permission denied)")
    return path
