"""The admin CLI and ``oncelog verify`` against a SASL_SSL broker, configured as Kafka's tools are:
``--command-config client.properties`` with the Java client's names (``sasl.jaas.config`` on continuation
lines, a PEM trust store). One broker for the module; about 10 s here (each CLI run is a new Python).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.client_properties import sasl_ssl_scram_properties
from tests.integration.tls_material import Pki, make_pki  # cryptography: in the test extra (pyproject.toml)

from oncelog.client import Admin, Producer
from oncelog.testing import EmbeddedBroker

pytestmark = pytest.mark.timeout(180)

JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="alice-secret";'


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def broker(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    tmp = tmp_path_factory.mktemp("sasl_ssl_cli")
    with EmbeddedBroker(data_dir=tmp / "data", log_path=tmp / "broker.log", config={
            "listeners": "SASL_SSL://127.0.0.1:0", "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(pki.broker_keystore), "sasl.enabled.mechanisms": "SCRAM-SHA-512,PLAIN",
            "listener.name.sasl_ssl.plain.sasl.jaas.config": JAAS, "group.initial.rebalance.delay.ms": "0"}) as b:
        yield b


def conf(b: EmbeddedBroker, pki: Pki) -> dict[str, Any]:
    return {"bootstrap.servers": b.bootstrap, "security.protocol": "SASL_SSL", "ssl.ca.location": str(pki.ca),
            "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice", "sasl.password": "alice-secret"}


def oncelog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oncelog.cli", *args], capture_output=True, text=True, timeout=90)


def one_line_error(r: subprocess.CompletedProcess[str], code: int) -> str:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_topics_and_groups_with_command_config(broker: EmbeddedBroker, pki: Pki, tmp_path: Path) -> None:
    props = sasl_ssl_scram_properties(tmp_path / "client.properties", pki.ca)
    cc = ["--bootstrap", broker.bootstrap, "--command-config", str(props)]
    r = oncelog("topics", "create", "secure-events", "--partitions", "2", *cc)
    assert r.returncode == 0, r.stderr
    r = oncelog("topics", "list", *cc)
    assert r.returncode == 0, r.stderr
    assert "secure-events" in r.stdout.split()
    with Admin(conf(broker, pki)) as admin:  # the CLI really created it, over SASL_SSL
        assert admin.partitions_of("secure-events") == [0, 1]
        admin.alter_group_offsets("secure-g", {("secure-events", 0): 0})
    r = oncelog("groups", "list", *cc)
    assert r.returncode == 0 and "secure-g" in r.stdout, r.stderr
    r = oncelog("txns", "list", "--json", *cc)
    assert r.returncode == 0 and json.loads(r.stdout) == [], r.stderr


def test_without_or_with_a_wrong_command_config_the_cli_fails_cleanly(broker: EmbeddedBroker, pki: Pki,
                                                                      tmp_path: Path) -> None:
    # a plaintext client on the SASL_SSL port: one line, exit 1 (the broker cannot be talked to)
    line = one_line_error(oncelog("topics", "list", "--bootstrap", broker.bootstrap), 1)
    assert "cannot talk to the broker" in line and "see --command-config" in line, line
    wrong = sasl_ssl_scram_properties(tmp_path / "wrong.properties", pki.ca, password="not-it")
    line = one_line_error(oncelog("topics", "list", "--bootstrap", broker.bootstrap, "--command-config", str(wrong)), 1)
    assert "Authentication failed" in line or "SASL_AUTHENTICATION_FAILED" in line, line
    # and the broker keeps serving a correct client
    r = oncelog("topics", "list", "--bootstrap", broker.bootstrap,
                "--command-config", str(sasl_ssl_scram_properties(tmp_path / "ok.properties", pki.ca)))
    assert r.returncode == 0, r.stderr


def test_verify_with_command_config(broker: EmbeddedBroker, pki: Pki, tmp_path: Path) -> None:
    c = conf(broker, pki)
    with Admin(c) as admin:
        admin.create_topic("v-in", 2)
        admin.create_topic("v-out", 2)
    p = Producer(c)
    try:
        for topic in ("v-in", "v-out"):
            for i in range(20):
                p.produce(topic, b"x", key=f"id{i}".encode(), partition=i % 2)
        p.produce("v-in", b"x", key=b"lost", partition=0)  # in the input only: verify must find it
        assert p.flush(20) == 0
    finally:
        p.close()
    with Admin(c) as admin:
        admin.alter_group_offsets("copier", {("v-in", 0): 11, ("v-in", 1): 10})
    props = sasl_ssl_scram_properties(tmp_path / "client.properties", pki.ca)
    r = oncelog("verify", "--bootstrap", broker.bootstrap, "--command-config", str(props), "--input", "v-in",
                "--output", "v-out", "--group", "copier", "--json")
    assert r.returncode == 1, r.stderr  # the anomaly below, found by reading both topics over SASL_SSL
    report = json.loads(r.stdout)
    assert (report["input_records"], report["output_records"], report["lost"]) == (21, 20, 1)
    assert report["offsets_ahead"] == 1  # the group's offset 11 on partition 0 passed "lost" (offset 10)
    line = one_line_error(oncelog("verify", "--bootstrap", broker.bootstrap, "--input", "v-in", "--output", "v-out"), 2)
    assert line.startswith(f"error: cannot talk to the broker at {broker.bootstrap}") and "--command-config" in line
