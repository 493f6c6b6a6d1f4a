"""Bad input to the ``oncelog`` command line (issue 10): each case gets one clear
line on stderr, never a traceback, a non-zero exit code (2 for usage and
configuration errors, 1 when the broker cannot be reached) and changes no data.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from oncelog.client.admin import Admin
from oncelog.client.groups import GroupAdmin
from oncelog.testing import EmbeddedBroker
from oncelog.testing.embedded import free_port

pytestmark = pytest.mark.timeout(120)

TOPIC, GROUP = "bad-cli", "bad-cli-g"


def oncelog(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oncelog.cli", *args], capture_output=True, text=True,
                          timeout=60, cwd=cwd)


def assert_one_line_error(r: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    root = tmp_path_factory.mktemp("cli_bad_input")
    with EmbeddedBroker(data_dir=root / "data", log_path=root / "broker.log",
                        config={"auto.create.topics.enable": "false"}) as b:
        with Admin(b.bootstrap) as admin:
            assert admin.create_topic(TOPIC, 2) is None
        with GroupAdmin(b.bootstrap) as groups:
            assert groups.commit(GROUP, {(TOPIC, 0): 0, (TOPIC, 1): 0}) == {}
        yield b


def state(b: EmbeddedBroker) -> tuple[list[str], dict[tuple[str, int], int]]:
    with Admin(b.bootstrap) as admin:
        topics = sorted(admin.list_topics())
    with GroupAdmin(b.bootstrap) as groups:
        return topics, groups.committed(GROUP)


# -- admin commands -----------------------------------------------------------


@pytest.mark.parametrize("command", ["topics", "groups"])
def test_unreachable_broker(command: str) -> None:
    port = free_port()  # nothing listens there
    r = oncelog(command, "list", "--bootstrap", f"127.0.0.1:{port}")
    assert_one_line_error(r, 1, f"127.0.0.1:{port}", "refused")


@pytest.mark.parametrize("command", ["topics", "groups"])
@pytest.mark.parametrize("bootstrap", ["nonsense", "127.0.0.1:abc", "127.0.0.1:99999", ":9092"])
def test_malformed_bootstrap(command: str, bootstrap: str) -> None:
    r = oncelog(command, "list", "--bootstrap", bootstrap)
    assert_one_line_error(r, 2, "--bootstrap", repr(bootstrap))


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["topics", "create", "bad-cli-new", "--config", "noequals"], "noequals"),
        (["topics", "list", "extra"], "extra"),
        (["groups", "list", "extra"], "extra"),
        (["groups", "reset-offsets", GROUP, "--topic", TOPIC, "--to-latest", "--partitions", "0,x", "--execute"],
         "0,x"),
    ],
    ids=["topic-config-without-equals", "topics-list-extra", "groups-list-extra", "partitions-not-numbers"],
)
def test_usage_errors_change_nothing(broker: EmbeddedBroker, args: list[str], needle: str) -> None:
    before = state(broker)
    r = oncelog(*args, "--bootstrap", broker.bootstrap)
    assert_one_line_error(r, 2, needle)
    assert r.stdout == ""
    assert state(broker) == before


# -- oncelog serve --------------------------------------------------------------


SERVE_CASES = {
    "num-partitions-not-a-number": ({"num.partitions": "abc"}, [], ["num.partitions", "'abc'"]),
    "retention-below-minus-one": ({"log.retention.ms": "-5"}, [], ["log.retention.ms", "'-5'", "-1"]),
    "boolean-maybe": ({"auto.create.topics.enable": "maybe"}, [], ["auto.create.topics.enable", "true or false"]),
    "sasl-ssl-listener-without-key-store": ({"listeners": "SASL_SSL://127.0.0.1:{port}"}, [],
                                            ["SASL_SSL", "no key store", "ssl.keystore.location"]),
    "unmapped-second-listener": ({"listeners": "PLAINTEXT://127.0.0.1:{port},FOO://127.0.0.1:1"}, [],
                                 ["FOO", "listener.security.protocol.map"]),
    "int-overflow": ({"socket.request.max.bytes": "4294967296"}, [], ["socket.request.max.bytes"]),
    "timestamp-type": ({"log.message.timestamp.type": "Whenever"}, [], ["CreateTime, LogAppendTime"]),
    "listen-nonsense": (None, ["--listen", "nonsense"], ["--listen", "'nonsense'"]),
    "listen-bad-port": (None, ["--listen", "127.0.0.1:70000"], ["--listen", "70000"]),
    "log-level-verbose": (None, ["--log-level", "verbose"], ["--log-level", "verbose", "debug"]),
    "missing-config-file": (None, ["--config", "{tmp}/no-such.properties"], ["no-such.properties"]),
}


@pytest.mark.parametrize("case", list(SERVE_CASES))
def test_serve_refuses_bad_config_before_creating_anything(tmp_path: Path, case: str) -> None:
    props, extra, needles = SERVE_CASES[case]
    port = free_port()
    data = tmp_path / "data"
    args = ["serve", "--data-dir", str(data)]
    if props is not None:
        conf = tmp_path / "server.properties"
        conf.write_text("".join(f"{k}={v.format(port=port)}\n" for k, v in props.items()))
        args += ["--config", str(conf)]
    if "--listen" not in extra:
        args += ["--listen", f"127.0.0.1:{port}"] if "listeners" not in (props or {}) else []
    args += [a.format(tmp=tmp_path) for a in extra]
    try:
        r = oncelog(*args, cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail(f"oncelog {' '.join(args)} started instead of refusing")
    assert_one_line_error(r, 2, *needles)
    assert not data.exists()


def test_unknown_config_key_is_warned_and_ignored(tmp_path: Path) -> None:
    log = tmp_path / "broker.log"
    with EmbeddedBroker(data_dir=tmp_path / "data", log_path=log,
                        config={"num.partitions": "3", "no.such.property": "1", "retention.ms": "5"}) as b:
        with Admin(b.bootstrap) as admin:
            assert admin.create_topic("t", -1) is None
            assert len(admin.describe_topic("t").partitions) == 3
    text = log.read_text()
    assert "WARNING" in text and "'no.such.property'" in text
    # a topic-level name is not a broker property (Kafka's server.properties ignores it too)
    assert "'retention.ms'" in text


@pytest.mark.parametrize("args", [["topics", "describe", TOPIC], ["groups", "describe", GROUP], ["txns", "list"]])
def test_closed_stdout_is_not_blamed_on_the_broker(broker: EmbeddedBroker, args: list[str]) -> None:
    """``oncelog ... | head -1``: the reader closing the pipe is no broker error and no traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "oncelog.cli", *args, "--bootstrap", broker.bootstrap],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    proc.wait(60)
    assert err == ""
    assert proc.returncode != 0
