"""The oncelog sink for PySpark 4 (``df.write`` / ``df.writeStream`` ``.format("oncelog")``).

Columns as Spark's Kafka sink: ``value`` (required), ``key``, ``topic`` (or
the ``topic`` option), ``partition``, ``headers``. ``deliveryGuarantee``:

* ``at_least_once``: each task produces with an idempotent producer and
  flushes; a retried task or a replayed batch writes again.
* ``exactly_once`` (the streaming default): the protocol of docs/spark.md.
  Each task writes in a KIP-939 transaction under a transactional id stable
  across its attempts (``<prefix>-<query>-<partition>``) and *prepares* it;
  the driver's ``commit()`` first records the decision "batch B of query Q
  commits these prepared transactions" in the decision topic (compacted, keyed
  by query: the latest decision of each query), then completes each one. Every
  transactional id is resolved against the query's latest decision before it
  is used again (decided: roll forward; undecided: abort), and a batch whose
  decision is recorded writes nothing when Spark replays it. The driver reads
  the decision topic (incrementally) and hands each batch's tasks the latest
  decision with the writer, so tasks do not read it.

Layer rule: ``oncelog.client`` only, so it works against Apache Kafka >= 4.1
with ``transaction.two.phase.commit.enable`` allowed.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from oncelog.client.admin import Admin
from oncelog.client.aio.transactions import PreparedTxnState
from oncelog.client.errors import InvalidTxnStateError, KafkaError, TopicAlreadyExistsError
from oncelog.client.java_config import from_java
from oncelog.client.producer import Producer
from oncelog.client.reader import EARLIEST, LATEST, READ_UNCOMMITTED, PartitionReader, ReaderError

EXACTLY_ONCE, AT_LEAST_ONCE = "exactly_once", "at_least_once"
DEFAULT_DECISION_TOPIC = "__oncelog_spark_decisions"
DEFAULT_TXN_PREFIX = "oncelog-spark"
CRASH_ENV = "ONCELOG_SPARK_SINK_CRASH"  # test-only: "<point>[@<batch>]"
CRASH_PGID_ENV = "ONCELOG_SPARK_SINK_CRASH_PGID"  # test-only: the process group to SIGKILL
CRASH_POINTS = ("during-write", "task-after-prepare", "before-decision", "after-decision", "after-complete")
# The decision topic: one record per query survives compaction; small segments keep the part not yet
# compacted (the active segment) small.
DECISION_TOPIC_CONFIG = {"cleanup.policy": "compact", "segment.bytes": str(1 << 20), "min.cleanable.dirty.ratio": "0.1"}
# Producer defaults of the sink (a kafka.* option wins): a task writes its whole partition at once, so
# batches of 256 KiB rather than the client's 16 KiB (Kafka's default) cut the requests, and the broker's
# work per record, by several times; still well under the broker's 1 MiB message.max.bytes.
PRODUCER_DEFAULTS = {"batch.size": "262144"}
# Producer properties the sink sets itself (Spark's Kafka sink refuses its serializers the same way).
_RESERVED = {"key.serializer", "value.serializer", "transactional.id", "transaction.two.phase.commit.enable"}


class SinkOptionError(ValueError):
    """A sink option is missing or malformed (Spark: IllegalArgumentException)."""


@dataclass(frozen=True)
class SinkOptions:
    bootstrap: str
    topic: str | None
    guarantee: str
    producer: dict[str, Any] = field(repr=False)  # may hold sasl.password
    txn_prefix: str
    decision_topic: str
    crash: str = ""  # test-only crash point (option "_testCrashAt"; else the env var)
    checkpoint: str = ""  # the query's checkpointLocation option ("" when Spark did not pass one)
    # the TLS and SASL properties of ``producer``: the driver's admin client, decision-log reader and
    # writer use them too (the password is in here: not in the repr)
    security: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def client_conf(self, bootstrap: str) -> dict[str, Any]:
        """A client configuration: ``bootstrap`` and the TLS and SASL settings."""
        return {**self.security, "bootstrap.servers": bootstrap}


def parse_sink_options(options: Mapping[str, str], streaming: bool) -> SinkOptions:
    opts = {str(k): str(v) for k, v in options.items()}
    lower = {k.lower(): v for k, v in opts.items()}
    bootstrap = lower.get("kafka.bootstrap.servers")
    if not bootstrap:
        raise SinkOptionError("Option 'kafka.bootstrap.servers' must be specified for configuring Kafka producer")
    guarantee = lower.get("deliveryguarantee", EXACTLY_ONCE if streaming else AT_LEAST_ONCE).strip().lower()
    if guarantee not in (EXACTLY_ONCE, AT_LEAST_ONCE):
        raise SinkOptionError(f"Option 'deliveryGuarantee' must be '{EXACTLY_ONCE}' or '{AT_LEAST_ONCE}', "
                              f"not {guarantee!r}")
    producer: dict[str, Any] = dict(PRODUCER_DEFAULTS)
    for k, v in opts.items():
        if k.lower().startswith("kafka."):
            name = k[len("kafka."):]
            if name in _RESERVED:
                raise SinkOptionError(f"Kafka option '{name}' is not supported as the sink sets it itself")
            producer[name] = v
    from oncelog.spark.options import client_security

    try:
        # sasl.jaas.config and PEM trust/key stores become oncelog's names; the rest passes unchanged
        producer = from_java(producer)
        security = client_security(producer, bootstrap)
    except ValueError as exc:
        raise SinkOptionError(f"Invalid Kafka option: {exc}") from None
    topic = lower.get("topic")
    return SinkOptions(bootstrap=bootstrap, topic=topic.strip() if topic else None, guarantee=guarantee,
                       producer=producer, txn_prefix=lower.get("transactionalidprefix", DEFAULT_TXN_PREFIX),
                       decision_topic=lower.get("decisiontopic", DEFAULT_DECISION_TOPIC),
                       crash=lower.get("_testcrashat", ""), checkpoint=lower.get("checkpointlocation", ""),
                       security=security)


# -- test-only crash points --------------------------------------------------------------------


def crash_point(point: str, batch: int, opts: SinkOptions | None = None) -> bool:
    """True when the test hook asks to crash at ``point`` (optionally only in batch ``@N``).

    The hook is the option ``_testCrashAt`` (it travels with the writer to the
    tasks) or the environment variable ONCELOG_SPARK_SINK_CRASH.
    """
    want = (opts.crash if opts is not None else "") or os.environ.get(CRASH_ENV, "")
    if not want:
        return False
    name, _, at = want.partition("@")
    return name == point and (not at or int(at) == batch)


def maybe_kill(point: str, batch: int, opts: SinkOptions | None = None) -> None:
    """SIGKILL the whole process group of the driver (test hook): nothing after this point runs."""
    if crash_point(point, batch, opts):
        pgid = int(os.environ.get(CRASH_PGID_ENV) or os.getpgrp())
        try:
            os.killpg(pgid, signal.SIGKILL)
        finally:
            # PySpark's daemon puts its Python workers in their own process group: this one (the
            # commit runner, a task) is not always in ``pgid`` and must not run on past the crash
            os.kill(os.getpid(), signal.SIGKILL)


# -- the decision log ----------------------------------------------------------------------------


@dataclass
class SinkCommit(WriterCommitMessage):
    """One task's result: its prepared transaction (exactly-once) or how many records it flushed."""

    query: str
    batch: int
    partition: int
    transactional_id: str | None = None
    state: str = ""  # str(PreparedTxnState); "" when nothing was prepared
    records: int = 0
    skipped: bool = False  # the batch was already decided: the replay wrote nothing


@dataclass(frozen=True)
class Decision:
    """The latest decision of a query: batch ``batch`` commits ``txns`` ({transactional id: state})."""

    query: str
    batch: int
    txns: dict[str, str]
    checkpoint: str = ""


@dataclass(frozen=True)
class DecisionHint:
    """What the driver hands the write tasks of one batch (pickled with the writer): the latest
    decision of ``query`` as the driver read it before the batch's tasks started (None: no decision).
    A task of another query id ignores it and looks the decision up itself."""

    query: str
    latest: Decision | None


class _Index:
    """The latest decision per query, from one pass over the decision topic, kept up to date by
    reading only what was appended since (``next_offset``)."""

    def __init__(self) -> None:
        self.next_offset = 0
        self.latest: dict[str, Decision] = {}
        self.by_checkpoint: dict[str, str] = {}  # checkpoint location -> the query of its latest decision
        self.records_read = 0  # how many records the index has read in all (tests: growth per batch)

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        self.records_read += 1
        if value is None:
            return
        try:
            d = json.loads(value)
            dec = Decision(str(d["query"]), int(d["batch"]), dict(d["txns"]), str(d.get("checkpoint") or ""))
        except (ValueError, KeyError, TypeError):
            return  # not a decision record
        old = self.latest.get(dec.query)
        if old is None or dec.batch >= old.batch:
            self.latest[dec.query] = dec
            if dec.checkpoint:
                self.by_checkpoint[dec.checkpoint] = dec.query


_INDEXES: dict[tuple[str, str], _Index] = {}  # (bootstrap, decision topic) -> index, per Python process
_INDEX_LOCK = threading.Lock()
_TOPICS_MADE: set[tuple[str, str]] = set()


class DecisionLog:
    """Decision records in the compacted decision topic (one partition).

    Key: the query id ``Q``; value ``{"query", "batch", "txns": {transactional id: state},
    "checkpoint"}``: the latest decision of ``Q``, which replaces the one before it (compaction keeps
    one record per query, so reading the topic costs what the number of queries costs, not the
    queries' history). Written by an idempotent producer with acks=all and flushed before any
    transaction is completed. Read read_uncommitted (the records are not transactional), by the
    driver: incrementally from where this process last read (the planner and commit processes of
    Spark's driver live as long as the query), so a batch reads only the decisions made since.
    Records of earlier versions (key ``<Q>/<B>``) are read the same way.
    """

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    @property
    def _bootstrap(self) -> str:
        return self.opts.bootstrap.split(",")[0]

    def ensure_topic(self) -> None:
        if (self._bootstrap, self.opts.decision_topic) in _TOPICS_MADE:
            return
        with Admin(self.opts.client_conf(self._bootstrap)) as admin:
            try:
                admin.create_topic(self.opts.decision_topic, 1, -1, DECISION_TOPIC_CONFIG)
            except TopicAlreadyExistsError:
                pass
            except KafkaError as exc:
                raise RuntimeError(f"cannot create the decision topic {self.opts.decision_topic}: {exc}") from None
        _TOPICS_MADE.add((self._bootstrap, self.opts.decision_topic))

    def refresh(self) -> _Index:
        """The index of this process, brought up to the decision topic's end (read from where it was)."""
        self.ensure_topic()
        key = (self._bootstrap, self.opts.decision_topic)
        with _INDEX_LOCK:
            idx = _INDEXES.get(key) or _Index()
            with PartitionReader(self._bootstrap, config=self.opts.security) as r:
                start = r.list_offset(self.opts.decision_topic, 0, EARLIEST)
                end = r.list_offset(self.opts.decision_topic, 0, LATEST)
                if idx.next_offset > end or idx.next_offset < start:
                    idx = _Index()  # the topic was recreated or truncated: read it again
                pos = max(idx.next_offset, start)
                if pos < end:
                    data = r.read_partition(self.opts.decision_topic, 0, READ_UNCOMMITTED, pos, end)
                    for rec in sorted(data.records, key=lambda x: x.offset):
                        idx.apply(rec.key, rec.value)
                idx.next_offset = max(pos, end)
            _INDEXES[key] = idx
            return idx

    def latest(self, query: str) -> Decision | None:
        """The latest decision of ``query`` (None when it has none)."""
        return self.refresh().latest.get(query)

    def hint(self) -> DecisionHint | None:
        """The driver's snapshot for the next batch's tasks: the latest decision made under this
        query's checkpoint location (None without a checkpointLocation option or any decision there)."""
        if not self.opts.checkpoint:
            return None
        idx = self.refresh()
        query = idx.by_checkpoint.get(self.opts.checkpoint)
        return DecisionHint(query, idx.latest[query]) if query is not None else None

    def record(self, query: str, batch: int, txns: dict[str, str]) -> None:
        self.ensure_topic()
        value = json.dumps({"query": query, "batch": batch, "txns": txns, "checkpoint": self.opts.checkpoint},
                           sort_keys=True).encode()
        conf = {**self.opts.client_conf(self.opts.bootstrap), "acks": "all", "enable.idempotence": True}
        p = Producer(conf)
        try:
            fut = p.produce(self.opts.decision_topic, value, key=query.encode(), partition=0)
            if p.flush(60) != 0:
                raise RuntimeError("the decision record was not written in time")
            fut.result(0)  # raises if it failed
        finally:
            p.close(5)


# -- transactions ----------------------------------------------------------------------------------


def _txn_producer(opts: SinkOptions, tid: str) -> Producer:
    conf = dict(opts.producer)
    conf.update({"bootstrap.servers": opts.bootstrap, "transactional.id": tid,
                 "transaction.two.phase.commit.enable": True})
    return Producer(conf)


def resolve(p: Producer, decided: str) -> str:
    """After ``init_transactions(keep_prepared_txn=True)``: settle the kept transaction, if any.

    ``decided`` is the state of ``T``'s transaction in the latest decision that
    names ``T`` ("" if none). Only that one can still be pending: every use of
    ``T`` settles the kept transaction before it prepares a new one, so an
    older decided transaction of ``T`` is complete. ``complete_transaction``
    commits when the kept state is ``decided`` and aborts otherwise (KIP-939).
    Returns "completed" or "none" (nothing was kept).
    """
    try:
        p.complete_transaction(PreparedTxnState.from_string(decided))
    except InvalidTxnStateError:
        return "none"  # no transaction was kept for this id
    return "completed"


def resolve_id(opts: SinkOptions, tid: str, decided: str) -> str:
    """Fence ``tid``'s producers, then settle its kept transaction (see :func:`resolve`)."""
    p = _txn_producer(opts, tid)
    try:
        p.init_transactions(keep_prepared_txn=True)
        return resolve(p, decided)
    finally:
        p.close(5)


COMPLETION_THREADS = 16  # transactional ids completed at once by commit()/abort()


def settle_all(opts: SinkOptions, states: dict[str, str]) -> None:
    """:func:`resolve_id` for each ``{transactional id: decided state}``, up to COMPLETION_THREADS at a
    time (each is a few round trips to the coordinator: a batch of many tasks must not pay them in
    series). Raises the first failure after all have been tried."""
    if len(states) <= 1:
        for tid, state in states.items():
            resolve_id(opts, tid, state)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(COMPLETION_THREADS, len(states)), thread_name_prefix="oncelog-complete") as pool:
        futures = [pool.submit(resolve_id, opts, tid, state) for tid, state in states.items()]
    for f in futures:
        f.result()


def decided_state(latest: Decision | None, tid: str) -> str:
    """The state of ``tid`` in the query's latest decision ("" when that decision does not name it).

    Only the latest decision matters: ``commit()`` of batch B completes every transaction of B's
    decision before it returns, and Spark starts batch B+1 only after that (a crash in between makes
    Spark replay B, whose ``commit()`` completes them). So when any task or ``commit()`` runs, every
    transaction of an earlier decision is complete, and a kept transaction not in the latest
    decision is undecided.
    """
    return latest.txns.get(tid, "") if latest is not None else ""


def sweep(opts: SinkOptions, query: str, latest: Decision | None, skip: set[str]) -> dict[str, str]:
    """Find the transactional ids of ``query`` the coordinator still has open (ListTransactions,
    filtered by prefix: ids from an earlier partition count, orphans) and settle each one."""
    prefix = f"{opts.txn_prefix}-{query}-"
    with Admin(opts.client_conf(opts.bootstrap.split(",")[0])) as admin:
        listed = admin.list_transactions(states=["Ongoing"])
    out = {}
    for t in sorted({r.transactional_id for r in listed}):
        if t.startswith(prefix) and t not in skip:
            out[t] = resolve_id(opts, t, decided_state(latest, t))
    return out


# -- writing rows ----------------------------------------------------------------------------------


def _bytes(v: Any) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode()
    return bytes(v)


def _bytes_column(col: Any) -> list[bytes | None]:
    """An Arrow column of binary or string values as a list of bytes (None for null), without a
    Python call per value."""
    import pyarrow as pa

    t = col.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        col = col.cast(pa.large_binary() if pa.types.is_large_string(t) else pa.binary())
        t = col.type
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return col.to_pylist()  # type: ignore[no-any-return]
    return [_bytes(v) for v in col.to_pylist()]


def _arrow_or_list(col: Any) -> Any:
    """A binary or string Arrow column as it is (``produce_batch`` encodes it from its buffers,
    :mod:`oncelog.client.arrow`), any other as a list of bytes."""
    import pyarrow as pa

    t = col.type
    if pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t) or pa.types.is_large_string(t):
        return col
    return _bytes_column(col)


def _take(col: Any, idx: list[int]) -> Any:
    if isinstance(col, list):
        return [col[i] for i in idx]
    import pyarrow as pa

    return col.take(pa.array(idx, pa.int64()))


def _as_list(col: Any) -> list[bytes | None]:
    return col if isinstance(col, list) else _bytes_column(col)


def write_batches(p: Producer, opts: SinkOptions, batches: Iterator[Any]) -> int:
    """Produce every row of the Arrow ``batches``; returns how many (delivery is checked by flush)."""
    n = 0
    for rb in batches:
        names = rb.schema.names
        if "value" not in names:
            raise SinkOptionError("Required attribute 'value' not found")
        cols = {name: rb.column(name).to_pylist() for name in names if name in ("topic", "partition", "headers")}
        rows = rb.num_rows
        values = _arrow_or_list(rb.column("value"))
        keys = _arrow_or_list(rb.column("key")) if "key" in names else None
        topics = cols.get("topic")
        parts = cols.get("partition")
        headers = cols.get("headers")
        if topics is None and opts.topic is None:
            raise SinkOptionError("topic option required when no 'topic' attribute is present. "
                                  "Use the topic option for setting a topic.")
        if (headers is None or not any(headers)) and (parts is None or None not in parts):
            # no headers, and every partition given or none: one produce_batch per (topic, partition),
            # each in row order (the order a row-by-row write gives each partition)
            if opts.topic is not None and parts is None:
                p.produce_batch(opts.topic, values, keys)
                n += rows
                continue
            groups: dict[tuple[str, int | None], list[int]] = {}
            for i in range(rows):
                topic = opts.topic or topics[i]  # type: ignore[index]
                if topic is None:
                    raise SinkOptionError("null topic present in the data. Use the topic option for setting a topic.")
                groups.setdefault((topic, parts[i] if parts is not None else None), []).append(i)
            for (topic, part), idx in groups.items():
                if len(idx) == rows:
                    p.produce_batch(topic, values, keys, partition=part)
                else:
                    p.produce_batch(topic, _take(values, idx), _take(keys, idx) if keys is not None else None,
                                    partition=part)
            n += rows
            continue
        values = _as_list(values)
        keys = _as_list(keys) if keys is not None else None
        for i in range(rows):
            topic = opts.topic or (topics[i] if topics is not None else None)
            if topic is None:
                raise SinkOptionError("null topic present in the data. Use the topic option for setting a topic.")
            hdrs = None
            if headers is not None and headers[i]:
                hdrs = [(h["key"], _bytes(h["value"])) for h in headers[i]]
            p.produce(topic, values[i], key=keys[i] if keys is not None else None,
                      partition=parts[i] if parts is not None else None, headers=hdrs)
            n += 1
    return n


def _task_context() -> tuple[str | None, int, int, int]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return None, 0, 0, 0
    batch = ctx.getLocalProperty("streaming.sql.batchId")
    return (ctx.getLocalProperty("sql.streaming.queryId"), int(batch) if batch is not None else 0,
            ctx.partitionId(), ctx.attemptNumber())


def write_task(opts: SinkOptions, query: str, batch: int, partition: int, attempt: int,
               batches: Iterator[Any], hint: DecisionHint | None = None) -> SinkCommit:
    """One write task (exactly-once or at-least-once).

    ``hint`` is the driver's snapshot of the query's latest decision, taken before this batch's
    tasks started; with it the task reads nothing from the decision topic. Without one (no
    checkpointLocation option, a new query, or a hint for another query id) the task looks the
    decision up itself (:meth:`DecisionLog.latest`).
    """
    if opts.guarantee == AT_LEAST_ONCE:
        conf = dict(opts.producer)
        conf["bootstrap.servers"] = opts.bootstrap
        p = Producer(conf)
        try:
            n = write_batches(p, opts, batches)
            left = p.flush(120)
            if left:
                raise RuntimeError(f"{left} records were not delivered")
        finally:
            p.close(5)
        return SinkCommit(query, batch, partition, records=n)
    tid = f"{opts.txn_prefix}-{query}-{partition}"
    latest = hint.latest if hint is not None and hint.query == query else DecisionLog(opts).latest(query)
    p = _txn_producer(opts, tid)
    try:
        p.init_transactions(keep_prepared_txn=True)  # fences an orphaned attempt of this task
        resolve(p, decided_state(latest, tid))
        if latest is not None and batch <= latest.batch:  # Spark replays a batch we committed: write nothing
            return SinkCommit(query, batch, partition, tid, decided_state(latest, tid), skipped=True)
        p.begin_transaction()
        n = 0
        for i, rb in enumerate(batches):
            n += write_batches(p, opts, iter([rb]))
            if i == 0:
                maybe_kill("during-write", batch, opts)
        state = p.prepare_transaction()
        if attempt == 0 and crash_point("task-after-prepare", batch, opts):
            raise RuntimeError("injected failure after prepare (test hook)")
        return SinkCommit(query, batch, partition, tid, str(state), records=n)
    finally:
        p.close(5)


def commit_batch(opts: SinkOptions, messages: list[Any], batch: int) -> None:
    """The driver's decision, then completion. Idempotent: a second call finds the decision recorded."""
    msgs = [m for m in messages if isinstance(m, SinkCommit)]
    if opts.guarantee == AT_LEAST_ONCE or not msgs:
        return
    query = msgs[0].query
    log = DecisionLog(opts)
    latest = log.latest(query)
    if latest is not None and batch < latest.batch:
        return  # a later batch is decided, so this one was committed and completed long ago
    if latest is None or latest.batch != batch:
        maybe_kill("before-decision", batch, opts)
        txns = {m.transactional_id: m.state for m in msgs if m.state and not m.skipped and m.transactional_id}
        log.record(query, batch, txns)
        latest = Decision(query, batch, txns, opts.checkpoint)
    maybe_kill("after-decision", batch, opts)
    settle_all(opts, {tid: latest.txns[tid] for tid in sorted(latest.txns)})
    sweep(opts, query, latest, skip=set(latest.txns))
    maybe_kill("after-complete", batch, opts)


def abort_batch(opts: SinkOptions, messages: list[Any], batch: int) -> None:
    """Abort what no decision commits; a batch with a decision record is rolled forward instead."""
    msgs = [m for m in messages if isinstance(m, SinkCommit)]
    if opts.guarantee == AT_LEAST_ONCE or not msgs:
        return
    query = msgs[0].query
    latest = DecisionLog(opts).latest(query)
    tids = {m.transactional_id for m in msgs if m.transactional_id}
    if latest is not None and latest.batch == batch:
        tids |= set(latest.txns)
    settle_all(opts, {tid: decided_state(latest, tid) for tid in sorted(tids)})


# -- Spark's writers -----------------------------------------------------------------------------


class OncelogBatchWriter(DataSourceArrowWriter):
    """``df.write``: at-least-once by default; exactly-once commits the whole job as one decision."""

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts
        self.job = uuid.uuid4().hex  # made on the driver, pickled to every task
        self.hint = DecisionHint(self.job, None)  # a new job id has no decision: tasks read nothing

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        _, _, partition, attempt = _task_context()
        return write_task(self.opts, self.job, 0, partition, attempt, iterator, self.hint)

    def commit(self, messages: list[Any]) -> None:
        commit_batch(self.opts, messages, 0)

    def abort(self, messages: list[Any]) -> None:
        abort_batch(self.opts, messages, 0)


class OncelogStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream``: exactly-once by default (see the module docstring).

    Spark makes a new writer on the driver for every micro-batch, before the batch's tasks run, and
    pickles it to them: the writer carries the driver's snapshot of the latest decision
    (:meth:`DecisionLog.hint`), so no task reads the decision topic.
    """

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts
        self.fallback = uuid.uuid4().hex
        self.hint: DecisionHint | None = None
        if opts.guarantee == EXACTLY_ONCE:
            try:
                self.hint = DecisionLog(opts).hint()
            except (KafkaError, ReaderError, OSError, RuntimeError):
                self.hint = None  # the tasks look the decision up themselves

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        query, batch, partition, attempt = _task_context()
        return write_task(self.opts, query or self.fallback, batch, partition, attempt, iterator, self.hint)

    def commit(self, messages: list[Any], batchId: int) -> None:
        commit_batch(self.opts, messages, batchId)

    def abort(self, messages: list[Any], batchId: int) -> None:
        abort_batch(self.opts, messages, batchId)


__all__ = ["OncelogBatchWriter", "OncelogStreamWriter", "SinkCommit", "SinkOptions", "parse_sink_options",
           "CRASH_POINTS"]
