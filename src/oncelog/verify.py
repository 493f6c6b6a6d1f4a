"""``oncelog verify``: an exactly-once auditor for a copy from one topic to another.

It works against any Kafka-compatible cluster: it reads over the protocol with
:mod:`oncelog.client.reader` and never imports the broker or the storage.

What is read, in this order (so that a run against a live copier is
conservative rather than noisy):

1. with ``--group``, the group's committed offsets for the input topic
   (OffsetFetch with ``require_stable``);
2. the input topic, read_committed, from the log start to the LSO;
3. the output topic, read_committed, from the log start to the LSO, with
   Kafka's client-side filtering of aborted transactions (as the Java consumer);
4. the output topic again, read_uncommitted, up to the high watermark, with
   every control marker: this pass is the independent witness of which
   records belong to aborted transactions.

Every record gets an id from ``--id``: ``key`` (default), ``value``,
``header:NAME`` (the last header called NAME) or ``json:FIELD`` (a field of
the JSON record value; ``a.b`` descends into objects when no field is named
``a.b``). Records without an id are counted as ``unidentified`` and take no
further part in the audit.

Anomaly classes (each is a count of records; all are 0 for a correct copy):

``lost``
    for each input id, how many fewer times it is in the output than in the
    input (with unique input ids: the number of input ids missing from the
    output).
``duplicated``
    for each id, how many more times it is in the output than
    ``max(1, times in the input)`` (with unique input ids: the extra copies).
``aborted_visible``
    records returned by the read_committed pass whose ``(partition, producer
    id, offset)`` lies inside a transaction that ended with an ABORT marker in
    the read_uncommitted pass. A transaction of producer P on a partition
    spans from P's first transactional record after its previous marker up to
    and including its next marker.
``out_of_order``
    the output order of records that came from the same input partition must
    follow their input order. Precisely: take the first occurrence in the
    output of each id that is in the input; group these output records by
    (output partition, input partition) with ``--order partition`` (default),
    or by (output partition, input partition, input record key) with
    ``--order key``; within a group in output offset order, the input offsets
    should increase. The count is, summed over groups, the smallest number of
    records whose removal leaves the group in input order (group size minus
    the longest increasing subsequence of input offsets); those records are
    the examples. There is no order across output partitions, so none is
    checked. ``--order none`` turns the check off.
``offsets_ahead``
    with ``--group``: input records below the group's committed offset for
    their partition whose id is not in the output (the group says it is done
    with a record that never arrived), plus one for each partition whose
    committed offset is beyond the end of the input.
``unexpected``
    output records whose id is not in the input (reported with the others;
    a copy makes no records of its own).

Also reported, not anomalies: ``aborted_seen`` (records of aborted
transactions in the read_uncommitted pass), ``undecided_seen`` (records of
transactions with no marker yet), ``input_records``, ``output_records``.

Exit status: 0 when every anomaly count is 0, 1 otherwise, 2 on usage or
connection errors (and on a topic that does not exist).
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

ANOMALIES = ("lost", "duplicated", "aborted_visible", "out_of_order", "offsets_ahead", "unexpected")
ORDERS = ("partition", "key", "none")


class UsageError(Exception):
    pass


# -- the pure core ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rec:
    """What the audit needs of one record."""

    partition: int
    offset: int
    id: str | None
    key: bytes | None = None
    producer_id: int = -1
    transactional: bool = False


@dataclass(frozen=True, slots=True)
class Mark:
    """A transaction marker at ``offset`` of ``partition``."""

    partition: int
    offset: int
    producer_id: int
    commit: bool


@dataclass(frozen=True, slots=True)
class Txn:
    """A transaction of one producer on one partition: ``[first_offset, marker_offset]``."""

    partition: int
    producer_id: int
    first_offset: int
    marker_offset: int | None  # None: no marker yet
    commit: bool | None


def _text(b: bytes) -> str:
    return b.decode("utf-8", "backslashreplace")


def id_extractor(spec: str) -> Callable[[Any], str | None]:
    """A function from a record (``key``/``value``/``headers``) to its id, for ``--id SPEC``."""
    if spec == "key":
        return lambda r: None if r.key is None else _text(r.key)
    if spec == "value":
        return lambda r: None if r.value is None else _text(r.value)
    kind, sep, name = spec.partition(":")
    if sep and name and kind == "header":

        def header(r: Any) -> str | None:
            found = [v for k, v in r.headers if k == name]
            return None if not found or found[-1] is None else _text(found[-1])

        return header
    if sep and name and kind == "json":
        path = name.split(".")

        def from_json(r: Any) -> str | None:
            if r.value is None:
                return None
            try:
                doc = json.loads(r.value)
            except (ValueError, UnicodeDecodeError):
                return None
            if isinstance(doc, dict) and name in doc:
                v = doc[name]
            else:
                v = doc
                for part in path:
                    if not isinstance(v, dict) or part not in v:
                        return None
                    v = v[part]
            if v is None:
                return None
            return v if isinstance(v, str) else json.dumps(v, sort_keys=True, separators=(",", ":"))

        return from_json
    raise UsageError(f"--id must be key, value, header:NAME or json:FIELD, not {spec!r}")


def transactions(records: Iterable[Rec], markers: Iterable[Mark]) -> list[Txn]:
    """The transactions of a read_uncommitted pass over one topic.

    Per partition, in offset order: a transactional record of producer P opens
    a transaction of P unless one is open; P's next marker closes it. A marker
    with no open transaction makes a transaction of the marker alone.
    """
    events: dict[int, list[tuple[int, int, Any]]] = defaultdict(list)
    for r in records:
        if r.transactional and r.producer_id >= 0:
            events[r.partition].append((r.offset, 0, r))
    for m in markers:
        events[m.partition].append((m.offset, 1, m))
    out: list[Txn] = []
    for partition, evs in events.items():
        evs.sort(key=lambda e: (e[0], e[1]))
        open_: dict[int, int] = {}
        for offset, kind, ev in evs:
            if kind == 0:
                open_.setdefault(ev.producer_id, offset)
            else:
                first = open_.pop(ev.producer_id, offset)
                out.append(Txn(partition, ev.producer_id, first, offset, ev.commit))
        out.extend(Txn(partition, pid, first, None, None) for pid, first in open_.items())
    out.sort(key=lambda t: (t.partition, t.first_offset, t.producer_id))
    return out


class _TxnIndex:
    """Find the transaction holding ``(partition, producer id, offset)``."""

    def __init__(self, txns: Iterable[Txn]) -> None:
        by: dict[tuple[int, int], list[Txn]] = defaultdict(list)
        for t in txns:
            by[(t.partition, t.producer_id)].append(t)
        self._by = {k: sorted(v, key=lambda t: t.first_offset) for k, v in by.items()}
        self._starts = {k: [t.first_offset for t in v] for k, v in self._by.items()}

    def find(self, partition: int, producer_id: int, offset: int) -> Txn | None:
        key = (partition, producer_id)
        starts = self._starts.get(key)
        if not starts:
            return None
        i = bisect.bisect_right(starts, offset) - 1
        if i < 0:
            return None
        t = self._by[key][i]
        if t.marker_offset is None or offset <= t.marker_offset:
            return t
        return None


def _lis_rest(items: list[tuple[int, Rec]]) -> list[tuple[int, Rec]]:
    """The items outside one longest subsequence with strictly increasing first elements."""
    tails: list[int] = []  # tails[k]: input offset ending the best run of length k+1
    tail_idx: list[int] = []
    prev = [-1] * len(items)
    for i, (pos, _rec) in enumerate(items):
        k = bisect.bisect_left(tails, pos)
        if k == len(tails):
            tails.append(pos)
            tail_idx.append(i)
        else:
            tails[k] = pos
            tail_idx[k] = i
        prev[i] = tail_idx[k - 1] if k else -1
    keep = set()
    i = tail_idx[-1] if tail_idx else -1
    while i >= 0:
        keep.add(i)
        i = prev[i]
    return [it for i, it in enumerate(items) if i not in keep]


@dataclass
class Report:
    counts: dict[str, int]
    examples: dict[str, list[dict[str, Any]]]
    input_records: int
    output_records: int
    aborted_seen: int = 0
    undecided_seen: int = 0
    unidentified: dict[str, int] = field(default_factory=lambda: {"input": 0, "output": 0})
    id_spec: str = "key"
    order: str = "partition"

    @property
    def clean(self) -> bool:
        return not any(self.counts[a] for a in ANOMALIES)

    def to_json(self) -> dict[str, Any]:
        return {**{a: self.counts[a] for a in ANOMALIES}, "examples": self.examples,
                "input_records": self.input_records, "output_records": self.output_records,
                "aborted_seen": self.aborted_seen, "undecided_seen": self.undecided_seen,
                "unidentified": self.unidentified, "id": self.id_spec, "order": self.order,
                "clean": self.clean}


def audit(input_records: list[Rec], output_committed: list[Rec], output_uncommitted: list[Rec] | None = None,
          output_markers: list[Mark] | None = None, committed_offsets: dict[int, int] | None = None,
          input_ends: dict[int, int] | None = None, order: str = "partition", max_examples: int = 10,
          id_spec: str = "key") -> Report:
    """Audit a copy. Records are given per topic in any order; offsets order them per partition.

    ``output_uncommitted``/``output_markers`` are the read_uncommitted pass over
    the output (None: skip the aborted_visible cross-check);
    ``committed_offsets`` maps input partition to the group's committed offset
    (None: no group); ``input_ends`` maps input partition to the offset the
    input was read up to.
    """
    if order not in ORDERS:
        raise UsageError(f"--order must be one of {', '.join(ORDERS)}")
    counts = dict.fromkeys(ANOMALIES, 0)
    examples: dict[str, list[dict[str, Any]]] = {a: [] for a in ANOMALIES}

    def example(kind: str, **data: Any) -> None:
        if len(examples[kind]) < max_examples:
            examples[kind].append(data)

    inp = sorted(input_records, key=lambda r: (r.partition, r.offset))
    out = sorted(output_committed, key=lambda r: (r.partition, r.offset))
    unidentified = {"input": sum(r.id is None for r in inp), "output": sum(r.id is None for r in out)}

    in_count: Counter[str] = Counter()
    origin: dict[str, Rec] = {}  # id -> its first input record
    for r in inp:
        if r.id is not None:
            in_count[r.id] += 1
            origin.setdefault(r.id, r)
    out_count: Counter[str] = Counter()
    out_where: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for r in out:
        if r.id is not None:
            out_count[r.id] += 1
            out_where[r.id].append((r.partition, r.offset))

    # lost: fewer copies in the output than in the input
    for id_, n in in_count.items():
        missing = n - out_count.get(id_, 0)
        if missing > 0:
            counts["lost"] += missing
            o = origin[id_]
            example("lost", id=id_, input_partition=o.partition, input_offset=o.offset)
    # duplicated / unexpected
    for r in out:
        if r.id is None:
            continue
        if r.id not in in_count:
            counts["unexpected"] += 1
            example("unexpected", id=r.id, partition=r.partition, offset=r.offset)
    for id_, n in out_count.items():
        extra = n - max(1, in_count.get(id_, 0))
        if extra > 0:
            counts["duplicated"] += extra
            example("duplicated", id=id_, count=n, output=[list(w) for w in out_where[id_]])

    # aborted_visible, with the read_uncommitted pass as witness
    aborted_seen = undecided_seen = 0
    if output_uncommitted is not None:
        txns = transactions(output_uncommitted, output_markers or [])
        index = _TxnIndex(txns)
        for r in output_uncommitted:
            if not r.transactional:
                continue
            t = index.find(r.partition, r.producer_id, r.offset)
            if t is not None and t.commit is False:
                aborted_seen += 1
            elif t is not None and t.commit is None:
                undecided_seen += 1
        for r in out:
            if r.producer_id < 0:
                continue
            t = index.find(r.partition, r.producer_id, r.offset)
            if t is not None and t.commit is False:
                counts["aborted_visible"] += 1
                example("aborted_visible", id=r.id, partition=r.partition, offset=r.offset,
                        producer_id=r.producer_id, txn_first_offset=t.first_offset,
                        abort_marker_offset=t.marker_offset)

    # out_of_order: per group, records off one longest increasing run of input offsets
    if order != "none":
        groups: dict[tuple[Any, ...], list[tuple[int, Rec]]] = defaultdict(list)
        seen: set[str] = set()
        for r in out:
            if r.id is None or r.id not in origin or r.id in seen:
                continue
            seen.add(r.id)
            o = origin[r.id]
            g: tuple[Any, ...] = (r.partition, o.partition) if order == "partition" else (r.partition, o.partition, o.key)
            groups[g].append((o.offset, r))
        for g, items in sorted(groups.items(), key=lambda kv: repr(kv[0])):
            for pos, r in _lis_rest(items):
                counts["out_of_order"] += 1
                example("out_of_order", id=r.id, output_partition=r.partition, output_offset=r.offset,
                        input_partition=g[1], input_offset=pos)

    # offsets_ahead: the group committed past records that are not in the output
    if committed_offsets is not None:
        for r in inp:
            c = committed_offsets.get(r.partition)
            if c is not None and r.offset < c and r.id is not None and r.id not in out_count:
                counts["offsets_ahead"] += 1
                example("offsets_ahead", partition=r.partition, committed_offset=c, input_offset=r.offset, id=r.id)
        for p, c in sorted(committed_offsets.items()):
            end = (input_ends or {}).get(p)
            if end is not None and c > end:
                counts["offsets_ahead"] += 1
                example("offsets_ahead", partition=p, committed_offset=c, input_end=end)

    return Report(counts, examples, len(inp), len(out), aborted_seen, undecided_seen, unidentified, id_spec, order)


# -- the IO shell -------------------------------------------------------------------------

def committed_offsets(bootstrap: str, group: str, topic: str, timeout: float = 30.0,
                      config: Mapping[str, Any] | None = None) -> dict[int, int]:
    """The group's committed offsets for ``topic`` (partition -> offset), waiting out pending transactions
    (OffsetFetch with require_stable: UNSTABLE_OFFSET_COMMIT is retried within ``timeout``).
    ``config``: more client properties (TLS and SASL: ``--command-config``)."""
    from oncelog.client import Admin

    ms = max(int(timeout * 1000), 1)
    # the file's client.id and timeouts win, as in Kafka's tools
    with Admin({"client.id": "oncelog-verify", "request.timeout.ms": ms, "default.api.timeout.ms": ms,
                **(config or {}), "bootstrap.servers": bootstrap}) as admin:
        parts = admin.partitions_of(topic)
        got = admin.list_group_offsets(group, [(topic, p) for p in parts], require_stable=True)
    return {p: off for (_t, p), off in got.items()}


def _reader(bootstrap: str, timeout: float, config: Mapping[str, Any] | None) -> Any:
    """A PartitionReader through the first of ``bootstrap``'s comma-separated addresses that answers
    (the last one's OSError when none does); client.id from ``config`` when it has one."""
    from oncelog.client.reader import PartitionReader

    client_id = str((config or {}).get("client.id") or "oncelog-verify")
    addresses = [a.strip() for a in bootstrap.split(",") if a.strip()] or [bootstrap]
    for i, address in enumerate(addresses):
        try:
            return PartitionReader(address, timeout=timeout, client_id=client_id, config=config)
        except OSError:
            if i == len(addresses) - 1:
                raise
    raise AssertionError("unreachable")


def run(bootstrap: str, input_topic: str, output_topic: str, id_spec: str = "key", group: str | None = None,
        order: str = "partition", max_examples: int = 10, timeout: float = 30.0,
        config: Mapping[str, Any] | None = None) -> Report:
    """Read both topics and audit them (see the module docstring). ``config``: client properties for
    every connection (TLS and SASL: ``security.protocol``, ``ssl.*``, ``sasl.*``; docs/client.md)."""
    from oncelog.client.reader import READ_COMMITTED, READ_UNCOMMITTED

    get_id = id_extractor(id_spec)
    if order not in ORDERS:
        raise UsageError(f"--order must be one of {', '.join(ORDERS)}")

    def recs(records: Iterable[Any]) -> list[Rec]:
        return [Rec(r.partition, r.offset, get_id(r), r.key, r.producer_id, r.transactional) for r in records]

    committed = committed_offsets(bootstrap, group, input_topic, timeout, config) if group else None
    with _reader(bootstrap, timeout, config) as reader:
        inp = reader.read_topic(input_topic, READ_COMMITTED)
        out_c = reader.read_topic(output_topic, READ_COMMITTED)
        out_u = [reader.read_partition(output_topic, pd.partition, READ_UNCOMMITTED, start=pd.start_offset)
                 for pd in out_c]
    return audit(
        [r for pd in inp for r in recs(pd.records)],
        [r for pd in out_c for r in recs(pd.records)],
        [r for pd in out_u for r in recs(pd.records)],
        [Mark(m.partition, m.offset, m.producer_id, m.commit) for pd in out_u for m in pd.markers],
        committed, {pd.partition: pd.end_offset for pd in inp}, order, max_examples, id_spec)


# -- output ---------------------------------------------------------------------------------

_LABELS = {
    "lost": "lost (in input, not in output)",
    "duplicated": "duplicated (extra copies in output)",
    "aborted_visible": "aborted records visible (read_committed)",
    "out_of_order": "out of order",
    "offsets_ahead": "group offsets ahead of output",
    "unexpected": "unexpected (in output, not in input)",
}


def _brief(ex: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in ex.items())


def print_table(report: Report, input_topic: str, output_topic: str, group: str | None) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal:
        console = Console(highlight=False, soft_wrap=True, width=max(console.width, 200))
    title = f"oncelog verify: {input_topic} -> {output_topic}" + (f" (group {group})" if group else "")
    table = Table(title=title, box=box.SIMPLE, title_justify="left")
    table.add_column("check", no_wrap=True)
    table.add_column("count", justify="right")
    table.add_column("first example")
    for a in ANOMALIES:
        n = report.counts[a]
        if a == "offsets_ahead" and group is None:
            table.add_row(_LABELS[a], Text("-"), Text("(no --group)"))
            continue
        if a == "out_of_order" and report.order == "none":
            table.add_row(_LABELS[a], Text("-"), Text("(--order none)"))
            continue
        ex = report.examples[a]
        table.add_row(_LABELS[a], Text(str(n), style="bold red" if n else "green"),
                      Text(_brief(ex[0]) if ex else ""))
    console.print(table)
    console.print(f"input records: {report.input_records}   output records (read_committed): "
                  f"{report.output_records}   aborted records seen (read_uncommitted): {report.aborted_seen}   "
                  f"undecided: {report.undecided_seen}   ids: {report.id_spec}   order: {report.order}")
    if report.unidentified["input"] or report.unidentified["output"]:
        console.print(f"[yellow]records without an id ({report.id_spec}): input {report.unidentified['input']}, "
                      f"output {report.unidentified['output']} (not audited)[/yellow]")
    console.print("[green]clean: no anomalies[/green]" if report.clean else "[bold red]ANOMALIES FOUND[/bold red]")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", default=None, help="HOST:PORT of a broker of the cluster (default: the first of "
                   "--command-config's bootstrap.servers, else 127.0.0.1:9092)")
    p.add_argument("--command-config", metavar="FILE",
                   help="client properties file, as Kafka's tools take (security.protocol, ssl.*, sasl.*; "
                   "see docs/client.md)")
    p.add_argument("--input", required=True, metavar="TOPIC", help="the topic that was copied")
    p.add_argument("--output", required=True, metavar="TOPIC", help="the copy")
    p.add_argument("--id", default="key", metavar="SPEC", dest="id_spec",
                   help="record id: key (default), value, header:NAME or json:FIELD (of the value)")
    p.add_argument("--group", help="check this group's committed input offsets against the output")
    p.add_argument("--order", default="partition", choices=ORDERS,
                   help="order check per (output partition, input partition) [default], per key too, or none")
    p.add_argument("--examples", type=int, default=10, help="examples kept per anomaly class (default 10)")
    p.add_argument("--timeout", type=float, default=30.0, help="socket and retry timeout in seconds")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def main(args: argparse.Namespace) -> int:
    from oncelog.client.errors import KafkaError
    from oncelog.client.reader import ReaderError

    if getattr(args, "client_config", None) is None and getattr(args, "command_config", None):
        # called without oncelog.cli.main (which resolves --command-config first): resolve it here
        from oncelog.cli import _client_settings, _UsageError

        try:
            _client_settings(args)
        except _UsageError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    try:
        report = run(args.bootstrap or "127.0.0.1:9092", args.input, args.output, args.id_spec, args.group,
                     args.order, args.examples, args.timeout, getattr(args, "client_config", None))
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        # connected, then dropped: what a TLS or SASL listener does to a plaintext client
        dropped = not getattr(args, "client_config", None) and type(exc) is ConnectionError
        hint = " (a TLS or SASL listener? see --command-config)" if dropped else ""
        print(f"error: cannot talk to the broker at {args.bootstrap}: {exc.strerror or exc}{hint}", file=sys.stderr)
        return 2
    except (ReaderError, KafkaError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_json()))
    else:
        print_table(report, args.input, args.output, args.group)
    return 0 if report.clean else 1
