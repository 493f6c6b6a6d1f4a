"""``--command-config FILE`` (Kafka's tools' client properties file) on every CLI command that connects
as a client: read with the broker config's Java-properties parser, Java names mapped, every key checked;
a bad file is one line on stderr and exit 2 before anything connects. No broker here."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from oncelog.cli import _client_settings, _command_config, main
from tests.client_properties import sasl_ssl_scram_properties

COMMANDS = [
    ["topics", "list"],
    ["topics", "describe", "t"],
    ["groups", "list"],
    ["groups", "describe", "g"],
    ["txns", "list"],
    ["txns", "find-hanging"],
    ["verify", "--input", "a", "--output", "b"],
]
# nothing listens here: a command that got past the file check would fail with exit 1, not 2
NOWHERE = ["--bootstrap", "127.0.0.1:9"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_missing_file_is_exit_2_on_every_client_command(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                        command: list[str]) -> None:
    code, err = run(capsys, *command, *NOWHERE, "--command-config", str(tmp_path / "nope.properties"))
    assert code == 2
    assert err.strip().splitlines() == [f"error: --command-config: cannot read {tmp_path / 'nope.properties'}: "
                                        "No such file or directory"]


@pytest.mark.parametrize("text, message", [
    ("sasl.mechanismz=PLAIN\n", "unknown configuration property 'sasl.mechanismz' (did you mean sasl.mechanism?)"),
    ("security.protocol=TLS\n", "security.protocol: invalid value 'TLS'"),
    ("security.protocol=SASL_PLAINTEXT\n", "sasl.mechanism is required with security.protocol=SASL_PLAINTEXT"),
    ("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=GSSAPI\nsasl.username=a\nsasl.password=b\n",
     "sasl.mechanism: 'GSSAPI' is not supported"),
    ("security.protocol=SSL\nssl.truststore.location=/etc/kafka/truststore.jks\nssl.truststore.password=changeit\n",
     "a JKS trust store is not supported by oncelog's client"),
    ("security.protocol=SSL\nssl.ca.location=/no/such/ca.pem\n", "ssl.ca.location: '/no/such/ca.pem' is not a file"),
    ("sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \\\n"
     '    username="alice";\n', "sasl.jaas.config: password not given"),
    ("request.timeout.ms=soon\n", "request.timeout.ms: invalid value 'soon'"),
    ("bootstrap.servers=localhost\n", "bootstrap.servers: 'localhost' is not host:port"),
])
@pytest.mark.parametrize("command", [COMMANDS[0], COMMANDS[2], COMMANDS[4], COMMANDS[6]], ids=lambda c: c[0])
def test_bad_keys_and_values_are_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                     command: list[str], text: str, message: str) -> None:
    f = tmp_path / "client.properties"
    f.write_text(text)
    code, err = run(capsys, *command, *NOWHERE, "--command-config", str(f))
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --command-config {f}: "), err
    assert message in lines[0]


def test_kafka_tools_client_properties_are_mapped(tmp_path: Path, pem_ca: Path) -> None:
    """A Java client.properties as Kafka's docs write it (JAAS on continuation lines, a PEM trust store)."""
    ca = pem_ca
    f = sasl_ssl_scram_properties(tmp_path / "client.properties", ca, extra="ssl.endpoint.identification.algorithm=\n")
    assert _command_config(str(f)) == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice",
        "sasl.password": "alice-secret", "ssl.ca.location": str(ca), "ssl.endpoint.identification.algorithm": ""}


@pytest.mark.parametrize("command, flag, expected", [
    ("topics", None, "h1:1,h2:2"),  # the file's list, for the admin client
    ("verify", None, "h1:1,h2:2"),  # verify reads through the first that answers
    ("topics", "h3:3", "h3:3"),  # the flag wins, as in Kafka's tools
    ("groups", None, "h1:1,h2:2"),
])
def test_bootstrap_from_the_file_unless_the_flag_is_given(tmp_path: Path, command: str, flag: str | None,
                                                          expected: str) -> None:
    f = tmp_path / "c.properties"
    f.write_text("bootstrap.servers=h1:1,h2:2\nclient.id=me\n")
    args = argparse.Namespace(command=command, bootstrap=flag, command_config=str(f))
    _client_settings(args)
    assert (args.bootstrap, args.client_config) == (expected, {"client.id": "me"})
    args = argparse.Namespace(command=command, bootstrap=None, command_config=None)
    _client_settings(args)
    assert (args.bootstrap, args.client_config) == ("127.0.0.1:9092", {})


class _FakeAdmin:
    configs: list[dict] = []

    def __init__(self, config: dict) -> None:
        self.configs.append(dict(config))

    def __enter__(self) -> "_FakeAdmin":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def partitions_of(self, topic: str) -> list[int]:
        return [0]

    def list_group_offsets(self, group: str, parts: list, require_stable: bool = False) -> dict:
        return {}


@pytest.mark.parametrize("file_conf, client_id", [({"client.id": "me"}, "me"), ({}, "oncelog-topics")])
def test_the_files_client_id_wins_for_the_admin_commands(monkeypatch: pytest.MonkeyPatch, file_conf: dict,
                                                         client_id: str) -> None:
    from oncelog import cli

    _FakeAdmin.configs = []
    monkeypatch.setattr("oncelog.client.Admin", _FakeAdmin)
    cli._admin(argparse.Namespace(command="topics", bootstrap="h:1", client_config=file_conf))
    assert _FakeAdmin.configs == [{"bootstrap.servers": "h:1", "client.id": client_id}]


def test_verify_uses_the_files_client_id_and_timeouts_and_tries_each_bootstrap(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from oncelog import verify

    opened: list[tuple[str, str]] = []

    class FakeReader:
        def __init__(self, bootstrap: str, timeout: float, client_id: str, config: dict) -> None:
            opened.append((bootstrap, client_id))
            if bootstrap != "live:2":
                raise ConnectionRefusedError(111, "Connection refused")

        def __enter__(self) -> "FakeReader":
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def read_topic(self, topic: str, isolation: int) -> list:
            return []

    _FakeAdmin.configs = []
    monkeypatch.setattr("oncelog.client.Admin", _FakeAdmin)
    monkeypatch.setattr("oncelog.client.reader.PartitionReader", FakeReader)
    conf = {"client.id": "me", "request.timeout.ms": 1234}
    verify.run("dead:1, live:2,other:3", "in", "out", group="g", timeout=5.0, config=conf)
    assert opened == [("dead:1", "me"), ("live:2", "me")]
    assert _FakeAdmin.configs == [{"bootstrap.servers": "dead:1, live:2,other:3", "client.id": "me",
                                   "request.timeout.ms": 1234, "default.api.timeout.ms": 5000}]
    opened.clear()
    with pytest.raises(ConnectionRefusedError):  # none answers: the last one's error
        verify.run("dead:1,dead:2", "in", "out", config=None)
    assert opened == [("dead:1", "oncelog-verify"), ("dead:2", "oncelog-verify")]
