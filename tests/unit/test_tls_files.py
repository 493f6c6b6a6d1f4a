"""The key-file checks and the no-password callback that broker/security.py and client/security.py share
(oncelog.protocol.tls): each side keeps its own wording of the error."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from oncelog.broker.config import ConfigError as BrokerConfigError
from oncelog.broker.security import load_security
from oncelog.client.config import ConfigError as ClientConfigError
from oncelog.client.config import parse_config
from oncelog.protocol import tls


def _deny_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    # os.access, not chmod: the tests may run as root, who may read any file
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if mode == os.R_OK else real(path, mode, **kw))


def test_readable_passes_a_readable_file_and_words_nothing_itself(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "x.pem"
    f.write_text("x")
    assert tls.readable(str(f), ValueError, "gone") == str(f)
    with pytest.raises(ValueError, match="^gone$"):
        tls.readable(str(tmp_path / "missing.pem"), ValueError, "gone")
    with pytest.raises(ValueError, match="^gone$"):
        tls.readable(str(tmp_path), ValueError, "gone")  # a directory is not a file
    _deny_reads(monkeypatch)
    with pytest.raises(ValueError, match=r"^cannot be read \(permission denied\)$"):
        tls.readable(str(f), ValueError, "gone")


def test_key_password_is_the_password_or_a_callback_that_raises() -> None:
    assert tls.key_password("secret") == "secret"
    assert tls.key_password("") == ""  # an empty password is still a password
    callback = tls.key_password(None)
    assert callable(callback)
    with pytest.raises(tls.KeyNeedsPassword):
        callback()  # type: ignore[operator]


def _broker_error(path: Path) -> str:
    props = {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(path)}
    with pytest.raises(BrokerConfigError) as exc:
        load_security(props, "SSL", "SSL")
    return str(exc.value)


def _client_error(path: Path) -> str:
    with pytest.raises(ClientConfigError) as exc:
        parse_config({"bootstrap.servers": "127.0.0.1:1", "security.protocol": "SSL",
                      "ssl.ca.location": str(path)}, "producer")
    return str(exc.value)


def test_broker_and_client_keep_their_own_messages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "missing.pem"
    assert _broker_error(missing) == f"invalid value {str(missing)!r} for ssl.keystore.location: no such file"
    assert _client_error(missing) == f"ssl.ca.location: {str(missing)!r} is not a file"
    present = tmp_path / "present.pem"
    present.write_text("not read")
    _deny_reads(monkeypatch)
    assert _broker_error(present) == (f"invalid value {str(present)!r} for ssl.keystore.location: cannot be read "
                                      "(permission denied)")
    assert _client_error(present) == f"ssl.ca.location: {str(present)!r} cannot be read (permission denied)"
