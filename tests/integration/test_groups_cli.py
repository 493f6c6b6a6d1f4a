"""``oncelog groups list|describe|delete|reset-offsets`` against a real broker and a real group."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from oncelog.client.groups import GroupAdmin
from oncelog.testing import EmbeddedBroker

pytestmark = pytest.mark.timeout(120)

TOPIC, GROUP, PARTITIONS = "cli-t", "cli-g", 3


def cli(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oncelog.cli", "groups", *args, "--bootstrap", bootstrap],
                          capture_output=True, text=True, timeout=60)


def test_groups_cli(tmp_path: Path, kit: Any) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    broker = EmbeddedBroker(data_dir=tmp_path / "data", log_path=tmp_path / "broker.log",
                            config={"group.initial.rebalance.delay.ms": "0"})
    broker.start()
    bs = broker.bootstrap
    try:
        kit.create_topic(bs, TOPIC, PARTITIONS)
        p = Producer({"bootstrap.servers": bs})
        for i in range(10 * PARTITIONS):
            p.produce(TOPIC, value=b"x", partition=i % PARTITIONS)
        assert p.flush(30) == 0
        c = Consumer({"bootstrap.servers": bs, "group.id": GROUP, "client.id": "cli-consumer",
                      "enable.auto.commit": False, "auto.offset.reset": "earliest"})
        c.subscribe([TOPIC])
        deadline = time.monotonic() + 30
        while len(c.assignment()) < PARTITIONS:
            c.poll(0.1)
            assert time.monotonic() < deadline, "no assignment"
        c.commit(offsets=[TopicPartition(TOPIC, part, 4 + part) for part in range(PARTITIONS)], asynchronous=False)

        out = cli(bs, "list")
        assert out.returncode == 0 and f"{GROUP}\tStable\tconsumer" in out.stdout.splitlines()

        out = cli(bs, "describe", GROUP)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[0] == f"Group: {GROUP}\tState: Stable\tProtocol: consumer/range\tMembers: 1"
        assert "\tClient: cli-consumer\tHost: /127.0.0.1\tAssignment: cli-t-0, cli-t-1, cli-t-2" in lines[1]
        assert lines[2] == "TOPIC\tPARTITION\tCOMMITTED\tLOG-END\tLAG\tMEMBER"
        member = lines[1].strip().split("\t")[0].removeprefix("Member: ")
        assert lines[3:] == [f"{TOPIC}\t{part}\t{4 + part}\t10\t{6 - part}\t{member}" for part in range(PARTITIONS)]

        # offsets of a group with members cannot be reset
        out = cli(bs, "reset-offsets", GROUP, "--topic", TOPIC, "--to-earliest", "--execute")
        assert out.returncode == 1 and "UNKNOWN_MEMBER_ID" in out.stderr
        assert cli(bs, "delete", GROUP).stderr.strip() == "error: NON_EMPTY_GROUP"

        c.close()
        with GroupAdmin(bs) as admin:
            assert admin.describe(GROUP).state == "Empty"
            out = cli(bs, "reset-offsets", GROUP, "--topic", TOPIC, "--to-earliest")  # dry run
            assert out.returncode == 0 and "dry run" in out.stdout
            assert admin.committed(GROUP) == {(TOPIC, part): 4 + part for part in range(PARTITIONS)}
            for args, want in [
                (["--to-earliest"], {0: 0, 1: 0, 2: 0}),
                (["--shift-by", "3"], {0: 3, 1: 3, 2: 3}),
                (["--to-offset", "100", "--partitions", "1"], {0: 3, 1: 10, 2: 3}),
                (["--to-latest", "--partitions", "0,2"], {0: 10, 1: 10, 2: 10}),
                (["--shift-by", "-4"], {0: 6, 1: 6, 2: 6}),
            ]:
                out = cli(bs, "reset-offsets", GROUP, "--topic", TOPIC, *args, "--execute")
                assert out.returncode == 0, out.stderr
                assert admin.committed(GROUP) == {(TOPIC, part): off for part, off in want.items()}, args
        out = cli(bs, "describe", GROUP)
        assert out.stdout.splitlines()[1:] == ["TOPIC\tPARTITION\tCOMMITTED\tLOG-END\tLAG\tMEMBER"] + [
            f"{TOPIC}\t{part}\t6\t10\t4\t-" for part in range(PARTITIONS)]

        out = cli(bs, "delete", GROUP)
        assert out.returncode == 0 and out.stdout.strip() == f"deleted group {GROUP}"
        assert GROUP not in cli(bs, "list").stdout
        out = cli(bs, "describe", GROUP)
        assert out.returncode == 1 and "not found" in out.stderr
        assert cli(bs, "delete", GROUP).stderr.strip() == "error: GROUP_ID_NOT_FOUND"
        assert cli(bs, "describe").returncode == 2  # a group id is required
    finally:
        broker.close()
