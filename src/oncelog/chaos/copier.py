"""One transactional copier process: ``python -m oncelog.chaos.copier --client confluent|kafka-python|session``.

The consume-transform-produce loop of Kafka's ``TransactionalMessageCopier``:
a group consumer (``subscribe``, so rebalances happen; ``read_committed``; no
auto commit) and a transactional producer (``transactional.id`` given per
copier slot, so a replacement fences the process it replaces). Per batch:

    begin -> produce one output record per input record (same key, same
    partition number, value ``copy:<input value>``) -> [pacing sleep] ->
    send_offsets_to_transaction(next offsets, group metadata) -> commit

The pacing sleep sits inside the transaction on purpose: a copier killed or a
broker bounced at a random moment then usually hits an open transaction that
already holds records and offsets. On an abortable error the copier aborts and
rewinds its assigned partitions to the group's committed offsets; on a fatal
error it exits with status 3 and the runner starts a replacement. When it has
nothing to consume it checks the group's committed offsets against the input
end offsets (``--ends``) and exits 0 once every partition is done.

It runs as its own OS process so the runner can SIGKILL it. SIGTERM is a clean
stop: the current transaction is finished, the consumer leaves the group, the
process exits 0. A watchdog exits with status 4 if the loop makes no progress
for ``--stuck-timeout`` seconds (a client call that never returns).

Stdout carries one line per event for the runner: ``ready``, ``commit N``
(records in a committed transaction), ``abort N REASON``, ``done``,
``stopped``, ``fatal REASON``.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import threading
import time
from typing import Any

EXIT_DONE = 0
EXIT_MISSING = 2
EXIT_FATAL = 3
EXIT_STUCK = 4
KP_CALL_TIMEOUT_MS = 15_000


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def transform(value: bytes | None) -> bytes:
    return b"copy:" + (value or b"")


class Control:
    """Halt flag (SIGTERM), pacing and the stuck watchdog."""

    def __init__(self, rate: float, stuck_timeout: float) -> None:
        self.halt = threading.Event()
        self.rate = rate
        self.stuck_timeout = stuck_timeout
        self.last_beat = time.monotonic()
        signal.signal(signal.SIGTERM, lambda *_: self.halt.set())
        if stuck_timeout > 0:
            threading.Thread(target=self._watchdog, daemon=True, name="watchdog").start()

    def beat(self) -> None:
        self.last_beat = time.monotonic()

    def _watchdog(self) -> None:
        while True:
            time.sleep(1.0)
            idle = time.monotonic() - self.last_beat
            if idle > self.stuck_timeout:
                emit(f"fatal stuck for {idle:.0f}s")
                print(f"copier stuck for {idle:.0f}s; thread stacks:", file=sys.stderr, flush=True)
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                sys.stderr.flush()
                os._exit(EXIT_STUCK)

    def pace(self, n: int, started: float, poll: Any = None) -> None:
        """Sleep (inside the transaction) so that this copier copies at most ``rate`` records/s."""
        if self.rate <= 0:
            return
        until = started + n / self.rate
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return
            if poll is not None:
                poll(min(left, 0.1))
            else:
                time.sleep(min(left, 0.1))


def fatal(reason: str) -> None:
    emit(f"fatal {reason}".replace("\n", " "))
    sys.stdout.flush()
    os._exit(EXIT_FATAL)


# -- confluent-kafka (librdkafka) -----------------------------------------------------------------

# librdkafka >= 2.10 re-bootstraps (KIP-899/KIP-1102) when every broker is down, which with one broker is
# every broker bounce; it then decommissions the learned broker, and send_offsets_to_transaction() can hang
# forever on the decommissioned group coordinator (confluentinc/librdkafka#5511, seen here with 2.16: the
# FindCoordinator answer arrives, no TxnOffsetCommit is ever sent, the API timeout never fires).
NO_REBOOTSTRAP = {"metadata.recovery.strategy": "none"}


def run_confluent(a: argparse.Namespace, ctl: Control) -> int:
    try:
        from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
    except ImportError:
        print("oncelog chaos: the confluent-kafka copier needs confluent-kafka (pip install 'oncelog[test]')",
              file=sys.stderr)
        return EXIT_MISSING
    ends = a.ends
    producer = Producer({
        "bootstrap.servers": a.bootstrap, "transactional.id": a.transactional_id, "client.id": f"{a.client_id}-p",
        "transaction.timeout.ms": a.txn_timeout_ms, "socket.timeout.ms": a.request_timeout_ms,
        "request.timeout.ms": a.request_timeout_ms, "linger.ms": 5, "retry.backoff.ms": 50,
        "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500, **NO_REBOOTSTRAP,
        **({"debug": os.environ["ONCELOG_CHAOS_DEBUG"]} if os.environ.get("ONCELOG_CHAOS_DEBUG") else {}),
    })
    while True:
        ctl.beat()
        try:
            producer.init_transactions(a.request_timeout_ms / 1000 * 4)
            break
        except KafkaException as exc:
            err = exc.args[0]
            if err.fatal() or not err.retriable():
                fatal(f"init_transactions: {err}")
            if ctl.halt.is_set():
                return EXIT_DONE
    emit("ready")
    consumer = Consumer({
        "bootstrap.servers": a.bootstrap, "group.id": a.group, "client.id": a.client_id,
        "isolation.level": "read_committed", "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "session.timeout.ms": a.session_timeout_ms, "heartbeat.interval.ms": max(a.session_timeout_ms // 10, 100),
        "max.poll.interval.ms": max(a.session_timeout_ms * 3, 20_000), "socket.timeout.ms": a.request_timeout_ms,
        "fetch.wait.max.ms": 100, "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500, **NO_REBOOTSTRAP,
        **({"partition.assignment.strategy": a.assignor} if a.assignor else {}),
    })
    consumer.subscribe([a.input])
    all_parts = [TopicPartition(a.input, p) for p in range(len(ends))]

    def committed(tps: list[Any]) -> list[Any]:
        for _ in range(10):
            ctl.beat()
            try:
                return consumer.committed(tps, timeout=a.request_timeout_ms / 1000 * 2)
            except KafkaException as exc:
                if exc.args[0].fatal():
                    break
                time.sleep(0.2)
        fatal("cannot read the committed offsets")
        return []

    def rewind() -> None:
        assignment = consumer.assignment()
        if not assignment:
            return
        for tp in committed(assignment):
            if tp.offset < 0:
                tp.offset = -2  # OFFSET_BEGINNING
            consumer.seek(tp)

    def end_txn(commit: bool) -> None:
        """Commit or abort, retrying retriable errors; raises KafkaException for the caller to abort."""
        for attempt in range(20):
            ctl.beat()
            try:
                if commit:
                    producer.commit_transaction(a.request_timeout_ms / 1000 * 4)
                else:
                    producer.abort_transaction(a.request_timeout_ms / 1000 * 4)
                return
            except KafkaException as exc:
                err = exc.args[0]
                if err.fatal():
                    fatal(f"{'commit' if commit else 'abort'}: {err}")
                if commit and err.txn_requires_abort():
                    raise
                if not err.retriable():
                    raise
                time.sleep(0.1)
        fatal(f"{'commit' if commit else 'abort'}: gave up")

    def abort(n: int, reason: str) -> None:
        try:
            end_txn(False)
        except KafkaException as exc:
            fatal(f"abort failed: {exc.args[0]}")
        emit(f"abort {n} {reason}".replace("\n", " "))
        rewind()

    last_check = 0.0
    try:
        while not ctl.halt.is_set():
            ctl.beat()
            msgs = consumer.consume(num_messages=a.max_per_txn, timeout=0.3)
            for m in msgs:
                if m.error():
                    if m.error().fatal():
                        fatal(f"consume: {m.error()}")
            msgs = [m for m in msgs if not m.error()]
            if not msgs:
                now = time.monotonic()
                if now - last_check > 1.0:
                    last_check = now
                    offsets = committed(all_parts)
                    if all(tp.offset >= ends[tp.partition] for tp in offsets):
                        emit("done")
                        return EXIT_DONE
                continue
            started = time.monotonic()
            try:
                producer.begin_transaction()
            except KafkaException as exc:
                fatal(f"begin_transaction: {exc.args[0]}")
            try:
                for m in msgs:
                    while True:
                        try:
                            producer.produce(a.output, key=m.key(), value=transform(m.value()),
                                             partition=m.partition(),
                                             headers=[("src", b"%d:%d" % (m.partition(), m.offset()))])
                            break
                        except BufferError:
                            producer.poll(0.05)
                ctl.pace(len(msgs), started, producer.poll)
                nxt: dict[int, int] = {}
                for m in msgs:
                    nxt[m.partition()] = max(nxt.get(m.partition(), 0), m.offset() + 1)
                positions = [TopicPartition(a.input, p, o) for p, o in sorted(nxt.items())]
                producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(),
                                                     a.request_timeout_ms / 1000 * 4)
                end_txn(True)
                emit(f"commit {len(msgs)}")
            except KafkaException as exc:
                err = exc.args[0]
                if err.fatal():
                    fatal(f"txn: {err}")
                abort(len(msgs), f"{KafkaError(err.code()).name() if err.code() else err}")
        emit("stopped")
        return EXIT_DONE
    finally:
        try:
            consumer.close()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
        producer.flush(5)


# -- kafka-python ----------------------------------------------------------------------------------


def kp_assignor(name: str) -> dict[str, Any]:
    if not name:
        return {}
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

    classes = {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor}
    if name not in classes:
        print(f"oncelog chaos: kafka-python has no {name} assignor", file=sys.stderr)
        sys.exit(EXIT_MISSING)
    return {"partition_assignment_strategy": [classes[name]]}


def run_kafka_python(a: argparse.Namespace, ctl: Control) -> int:
    try:
        from kafka import KafkaConsumer, KafkaProducer, OffsetAndMetadata, TopicPartition
        from kafka.errors import KafkaError
    except ImportError:
        print("oncelog chaos: the kafka-python copier needs kafka-python (pip install 'oncelog[test]')",
              file=sys.stderr)
        return EXIT_MISSING
    ends = a.ends
    if os.environ.get("ONCELOG_CHAOS_DEBUG"):
        import logging

        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr,
                            format="%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s")
    producer = KafkaProducer(bootstrap_servers=a.bootstrap, transactional_id=a.transactional_id,
                             transaction_timeout_ms=a.txn_timeout_ms, linger_ms=5,
                             request_timeout_ms=max(a.request_timeout_ms, 5000), client_id=f"{a.client_id}-p",
                             retry_backoff_ms=50, reconnect_backoff_max_ms=500, max_block_ms=30_000)
    for attempt in range(20):
        ctl.beat()
        try:
            producer.init_transactions()
            break
        except KafkaError as exc:
            if attempt == 19 or ctl.halt.is_set():
                fatal(f"init_transactions: {exc!r}")
            time.sleep(0.2)
    emit("ready")
    consumer = KafkaConsumer(bootstrap_servers=a.bootstrap, group_id=a.group, client_id=a.client_id,
                             isolation_level="read_committed", enable_auto_commit=False,
                             auto_offset_reset="earliest", session_timeout_ms=a.session_timeout_ms,
                             heartbeat_interval_ms=max(a.session_timeout_ms // 10, 100),
                             max_poll_interval_ms=max(a.session_timeout_ms * 3, 20_000),
                             request_timeout_ms=max(a.request_timeout_ms, 5000) + 1000,
                             fetch_max_wait_ms=100, max_poll_records=a.max_per_txn,
                             reconnect_backoff_max_ms=500, retry_backoff_ms=50, **kp_assignor(a.assignor))
    # as in tests/integration/test_groups_clients.py: load metadata before joining, and finish (re)joins
    # with a long timer (kafka-python 3.0.x drops a join round that outlives poll's timer)
    consumer.partitions_for_topic(a.input)
    consumer.subscribe([a.input])
    coordinator = consumer._coordinator
    manager = producer._transaction_manager
    all_parts = [TopicPartition(a.input, p) for p in range(len(ends))]

    def committed(tp: Any) -> int | None:
        for _ in range(10):
            ctl.beat()
            try:
                return consumer.committed(tp)
            except KafkaError:
                time.sleep(0.2)
        fatal("cannot read the committed offsets")
        return None

    def rewind() -> None:
        for tp in consumer.assignment():
            c = committed(tp)
            if c is None:
                consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, c)

    def bounded(start: Any, what: str) -> None:
        """Run a transactional API call with a deadline: kafka-python 3.0.12 waits forever when it loses
        an in-flight AddOffsetsToTxn/EndTxn on a disconnect (it looks the coordinator up again and never
        resends the request; seen here on every broker bounce). The replacement process fences this one."""
        result = start()
        producer._sender.wakeup()
        if not result.wait(timeout_ms=KP_CALL_TIMEOUT_MS):
            fatal(f"{what}: no result in {KP_CALL_TIMEOUT_MS} ms (kafka-python lost the request)")

    last_check = 0.0
    try:
        while not ctl.halt.is_set():
            ctl.beat()
            try:
                if coordinator.need_rejoin():
                    coordinator.ensure_active_group(timeout_ms=10_000)
                batch = consumer.poll(timeout_ms=300, max_records=a.max_per_txn)
            except KafkaError as exc:
                emit(f"abort 0 poll {exc!r}")
                time.sleep(0.2)
                continue
            if not batch:
                now = time.monotonic()
                if now - last_check > 1.0:
                    last_check = now
                    if all((committed(tp) or 0) >= ends[tp.partition] for tp in all_parts):
                        emit("done")
                        return EXIT_DONE
                continue
            n = sum(len(v) for v in batch.values())
            started = time.monotonic()
            try:
                producer.begin_transaction()
                offsets = {}
                for tp, msgs in batch.items():
                    for m in msgs:
                        producer.send(a.output, key=m.key, value=transform(m.value), partition=tp.partition,
                                      headers=[("src", b"%d:%d" % (tp.partition, m.offset))])
                    offsets[TopicPartition(a.input, tp.partition)] = OffsetAndMetadata(msgs[-1].offset + 1, "", -1)
                ctl.pace(n, started)
                bounded(lambda: manager.send_offsets_to_transaction(offsets, consumer.group_metadata()),
                        "send_offsets_to_transaction")
                bounded(manager.begin_commit, "commit_transaction")
                emit(f"commit {n}")
            except KafkaError as exc:
                if manager.has_fatal_error():
                    fatal(f"txn: {exc!r}")
                try:
                    bounded(manager.begin_abort, "abort_transaction")
                except KafkaError as exc2:
                    fatal(f"abort failed after {exc!r}: {exc2!r}")
                emit(f"abort {n} {type(exc).__name__}")
                rewind()
        emit("stopped")
        return EXIT_DONE
    finally:
        try:
            consumer.close()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
        try:
            producer.close(timeout=5)
        except Exception:  # noqa: BLE001
            pass


# -- oncelog's TransactSession ------------------------------------------------------------------------


def run_session(a: argparse.Namespace, ctl: Control) -> int:
    """The same copy on :class:`oncelog.client.TransactSession`: the session owns the group member, the
    consumer and the transactional producer (abort on revoke, heartbeat before commit, stable offsets,
    rewinds after an abort). Its transaction timeout is derived from the session timeout (seed 003)."""
    import logging

    from oncelog.client import TransactSession
    from oncelog.client.errors import KafkaError

    # the session's INFO lines (why a transaction aborts, stable-offsets mode) go to the copier's log
    logging.basicConfig(level=logging.DEBUG if os.environ.get("ONCELOG_CHAOS_DEBUG") else logging.INFO,
                        stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    conf = {"bootstrap.servers": a.bootstrap, "group.id": a.group, "client.id": a.client_id,
            "transactional.id": a.transactional_id, "auto.offset.reset": "earliest", "linger.ms": 5,
            "session.timeout.ms": a.session_timeout_ms,
            "heartbeat.interval.ms": max(a.session_timeout_ms // 10, 100),
            "max.poll.interval.ms": max(a.session_timeout_ms * 3, 20_000),
            "request.timeout.ms": max(a.request_timeout_ms, 5000),
            **({"partition.assignment.strategy": a.assignor} if a.assignor else {})}
    session = None
    for attempt in range(20):
        ctl.beat()
        try:
            session = TransactSession(conf, [a.input])
            break
        except KafkaError as exc:
            if attempt == 19 or ctl.halt.is_set():
                fatal(f"start: {exc!r}")
            time.sleep(0.2)
    assert session is not None
    emit("ready")
    ends = a.ends
    parts = [(a.input, p) for p in range(len(ends))]
    last_check = 0.0
    try:
        while not ctl.halt.is_set():
            ctl.beat()
            try:
                recs = session.poll(0.3, a.max_per_txn)
            except KafkaError as exc:
                if exc.fatal or session._s._error is not None:
                    fatal(f"poll: {exc!r}")
                emit(f"abort 0 poll {exc!r}")
                time.sleep(0.2)
                continue
            if not recs:
                now = time.monotonic()
                if now - last_check > 1.0:
                    last_check = now
                    try:
                        got = session.committed(parts, 10)
                    except KafkaError:
                        continue
                    if all((got.get(tp).offset if got.get(tp) else 0) >= ends[tp[1]] for tp in parts):
                        emit("done")
                        return EXIT_DONE
                continue
            n = len(recs)
            started = time.monotonic()
            session.produce_many({"topic": a.output, "key": m.key, "value": transform(m.value),
                                  "partition": m.partition,
                                  "headers": [("src", b"%d:%d" % (m.partition, m.offset))]} for m in recs)
            ctl.pace(n, started)
            before = dict(session.counters["aborts_by_cause"])
            try:
                ok = session.end(commit=True)
            except KafkaError as exc:
                fatal(f"txn: {exc!r}")
            if ok:
                emit(f"commit {n}")
            else:
                after = session.counters["aborts_by_cause"]
                cause = next((c for c in after if after[c] != before.get(c)), "abort")
                emit(f"abort {n} {cause}")
        emit("stopped")
        return EXIT_DONE
    finally:
        try:
            session.close()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass


CLIENTS = {"confluent": run_confluent, "kafka-python": run_kafka_python, "session": run_session}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m oncelog.chaos.copier", description=__doc__.split("\n\n")[0])
    p.add_argument("--client", choices=sorted(CLIENTS), default="confluent")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--transactional-id", required=True)
    p.add_argument("--client-id", default="copier")
    p.add_argument("--ends", required=True, help="input end offsets, comma-separated, partition order")
    p.add_argument("--max-per-txn", type=int, default=100)
    p.add_argument("--rate", type=float, default=0.0, help="records/s for this copier (0: unpaced)")
    p.add_argument("--session-timeout-ms", type=int, default=6000)
    p.add_argument("--txn-timeout-ms", type=int, default=20_000)
    p.add_argument("--request-timeout-ms", type=int, default=3000)
    p.add_argument("--stuck-timeout", type=float, default=120.0)
    p.add_argument("--assignor", default="", help="partition.assignment.strategy (default: the client's own)")
    a = p.parse_args(argv)
    a.ends = [int(x) for x in a.ends.split(",")]
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    ctl = Control(a.rate, a.stuck_timeout)
    return CLIENTS[a.client](a, ctl)


if __name__ == "__main__":
    sys.exit(main())
