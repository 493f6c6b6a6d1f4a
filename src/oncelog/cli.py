"""oncelog serve|topics|groups|txns|verify|chaos: the broker and a small admin CLI that speaks the protocol.

Bad input gets one line on stderr and a non-zero exit: 2 for usage and
configuration errors, 1 when the broker cannot start or cannot be reached.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from oncelog import __version__
from oncelog.broker.config import ConfigError, parse_listener, parse_listener_name

DESCRIPTION = "oncelog: a single-node broker that speaks the Kafka protocol, and an admin CLI for it."
LOG_LEVELS = ["debug", "info", "warning", "error", "critical"]


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors in one line (``PROG: error: ...``) and exit code 2."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _listen(value: str) -> tuple[str, int, str | None]:
    try:
        return (*parse_listener(value), parse_listener_name(value))
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace(" for --listen", "")) from None


def _bootstrap(value: str) -> str:
    host, sep, port = value.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535 or "," in value or "/" in value:
        raise argparse.ArgumentTypeError(f"invalid value {value!r}: expected HOST:PORT of one broker")
    return value.strip()


def _partitions(value: str) -> list[int]:
    try:
        parts = [int(p) for p in value.split(",")]
    except ValueError:
        parts = []
    if not parts or any(p < 0 for p in parts):
        raise argparse.ArgumentTypeError(f"invalid value {value!r}: expected comma-separated partition numbers")
    return parts


def _topic_config(value: str) -> tuple[str, str]:
    key, sep, val = value.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"invalid value {value!r}: expected KEY=VALUE")
    return key.strip(), val


class _StdoutClosed(Exception):
    """stdout's reader went away (``oncelog ... | head``): not an OSError, so it is
    never mistaken for a broker connection failure."""


class _Stdout:
    """sys.stdout, with a broken pipe turned into _StdoutClosed."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except BrokenPipeError:
            raise _StdoutClosed from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise _StdoutClosed from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _serve(args: argparse.Namespace) -> int:
    from oncelog.broker.config import BrokerConfig, StartupError
    from oncelog.broker.server import LogDirFailed, run

    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    overrides: dict[str, Any] = {}
    if args.listen:
        # a NAME:// in --listen names the listener; without one the name from listeners (or PLAINTEXT) stays
        overrides["host"], overrides["port"], overrides["listener_name"] = args.listen
    if args.data_dir:
        overrides["data_dir"] = Path(args.data_dir)
    try:
        config = BrokerConfig.load(args.config, **overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        run(config)
    except StartupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except LogDirFailed:  # the broker logged why (one line), as Kafka's halts with status 1
        return 1
    return 0


class _UsageError(Exception):
    """A bad command line: one line on stderr, exit 2."""


def _int_arg(flag: str, text: str | None, minimum: int) -> int | None:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise _UsageError(f"{flag} must be an integer, not {text!r}") from None
    if value < minimum:
        raise _UsageError(f"{flag} must be >= {minimum}, not {value}")
    return value


def _offsets_from_json(path: str) -> dict[tuple[str, int], int]:
    """Kafka's kafka-delete-records.sh --offset-json-file format:
    ``{"partitions": [{"topic": "t", "partition": 0, "offset": 10}], "version": 1}``."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise _UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise _UsageError(f"{path} is not JSON: {exc}") from None
    entries = data.get("partitions") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise _UsageError(f'{path}: expected {{"partitions": [{{"topic": ..., "partition": ..., "offset": ...}}]}}')
    offsets: dict[tuple[str, int], int] = {}
    for e in entries:
        ok = isinstance(e, dict) and isinstance(e.get("topic"), str) and e["topic"]
        ok = ok and all(type(e.get(k)) is int for k in ("partition", "offset"))
        if not ok or e["partition"] < 0 or e["offset"] < -1:
            raise _UsageError(f"{path}: bad entry {json.dumps(e)} (topic, partition >= 0, offset >= -1)")
        key = (e["topic"], e["partition"])
        if key in offsets:
            raise _UsageError(f"{path}: duplicate partition {key[0]}-{key[1]}")
        offsets[key] = e["offset"]
    return offsets


DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def _command_config(path: str) -> dict[str, Any]:
    """``--command-config FILE``: a client properties file, as Kafka's tools take (Java properties,
    read by the broker config's parser), with the Java client's TLS and SASL names mapped to oncelog's
    (:mod:`oncelog.client.java_config`) and every key checked as an admin client's. Raises _UsageError."""
    from oncelog.client.config import ConfigError as ClientConfigError
    from oncelog.client.config import parse_config
    from oncelog.client.java_config import from_java
    from oncelog.broker.config import ConfigError as PropertiesError
    from oncelog.broker.config import parse_properties

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise _UsageError(f"--command-config: cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise _UsageError(f"--command-config: {path} is not a UTF-8 text file") from None
    try:
        conf = from_java(parse_properties(text))
        parse_config({"bootstrap.servers": DEFAULT_BOOTSTRAP, **conf}, "admin")
    except (ClientConfigError, PropertiesError) as exc:
        raise _UsageError(f"--command-config {path}: {exc}") from None
    return conf


def _client_settings(args: argparse.Namespace) -> None:
    """Set ``args.client_config`` (from --command-config) and ``args.bootstrap`` (the flag, else the file's
    bootstrap.servers, else 127.0.0.1:9092; a list: verify reads through the first that answers).
    Raises _UsageError."""
    conf = _command_config(args.command_config) if args.command_config else {}
    file_bootstrap = conf.pop("bootstrap.servers", None)
    if args.bootstrap is None and file_bootstrap:
        args.bootstrap = str(file_bootstrap).strip()
    args.bootstrap = args.bootstrap or DEFAULT_BOOTSTRAP
    args.client_config = conf


def _admin_config(args: argparse.Namespace) -> dict[str, Any]:
    """The admin client's properties: ``--command-config``'s (its client.id wins, as in Kafka's tools)
    and ``--bootstrap``."""
    return {"client.id": f"oncelog-{args.command}", **(getattr(args, "client_config", None) or {}),
            "bootstrap.servers": args.bootstrap}


def _admin(args: argparse.Namespace) -> Any:
    """The admin client for ``--bootstrap`` and ``--command-config`` (raises KafkaConnectionError when
    nothing answers there)."""
    from oncelog.client import Admin

    return Admin(_admin_config(args))


def _admin_command(action: Any) -> Any:
    """Run ``action(admin, args)``: an unreachable broker or a Kafka error is one line and exit 1."""
    def run(args: argparse.Namespace) -> int:
        from oncelog.client.errors import KafkaConnectionError, KafkaError

        try:
            with _admin(args) as admin:
                return int(action(admin, args))
        except KafkaConnectionError as exc:
            # connected, then dropped: what a TLS or SASL listener does to a plaintext client
            dropped = not getattr(args, "client_config", None) and not exc.message.startswith("cannot connect")
            hint = " (a TLS or SASL listener? see --command-config)" if dropped else ""
            print(f"error: cannot talk to the broker at {args.bootstrap}: {exc.message}{hint}", file=sys.stderr)
            return 1
        except KafkaError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return run


def _delete_records(admin: Any, args: argparse.Namespace) -> int:
    """``topics delete-records``: move log start offsets up (Kafka's DeleteRecords)."""
    from oncelog.client.errors import UnknownTopicOrPartitionError

    offsets, partition, offset = args.delete_records
    if offsets is None:
        try:
            parts = [partition] if partition is not None else admin.partitions_of(args.topic)
        except UnknownTopicOrPartitionError:
            print(f"error: topic {args.topic} not found", file=sys.stderr)
            return 1
        offsets = {(args.topic, p): offset for p in parts}
    result = admin.delete_records(offsets)
    failed = 0
    for topic, p in sorted(result):
        err = result.errors.get((topic, p))
        if err:
            failed += 1
            print(f"partition: {topic}-{p}\terror: {err.name}", file=sys.stderr)
        else:
            print(f"partition: {topic}-{p}\tlow_watermark: {result[(topic, p)]}")
    return 1 if failed else 0


def _delete_records_args(args: argparse.Namespace
                         ) -> tuple[dict[tuple[str, int], int] | None, int | None, int | None]:
    """``(offsets from --offset-json-file or None, --partition, --offset)``; raises _UsageError."""
    partition = _int_arg("--partition", args.partition, 0)
    offset = _int_arg("--offset", args.offset, -1)
    if args.offset_json_file is not None:
        if args.topic or partition is not None or offset is not None:
            raise _UsageError("--offset-json-file replaces TOPIC, --partition and --offset")
        return _offsets_from_json(args.offset_json_file), partition, offset
    if not args.topic or offset is None:
        raise _UsageError("topics delete-records needs TOPIC and --offset (or --offset-json-file)")
    return None, partition, offset


def _topics(args: argparse.Namespace) -> int:
    if args.action == "delete-records":
        try:
            args.delete_records = _delete_records_args(args)
        except _UsageError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    return int(_admin_command(_topics_action)(args))


def _topics_action(admin: Any, args: argparse.Namespace) -> int:
    from oncelog.client.errors import KafkaError, UnknownTopicOrPartitionError

    if args.action == "delete-records":
        return _delete_records(admin, args)
    if args.action == "list":
        for name in admin.list_topics():
            print(name)
        return 0
    if args.action == "describe":
        try:
            info = admin.topic_summary(args.topic)
        except UnknownTopicOrPartitionError:
            print(f"topic {args.topic} not found", file=sys.stderr)
            return 1
        print(f"Topic: {info['name']}\tTopicId: {info['topic_id']}\tPartitionCount: {len(info['partitions'])}")
        for key, value in sorted(info["configs"].items()):
            print(f"\t{key}={value}")
        for p in info["partitions"]:
            print(
                f"\tPartition: {p['partition']}\tLeader: {p['leader']}\t"
                f"LogStartOffset: {p['log_start_offset']}\tHighWatermark: {p['high_watermark']}"
            )
        return 0
    try:
        if args.action == "create":
            admin.create_topic(args.topic, args.partitions, args.replication_factor, dict(args.config or []))
        else:
            admin.delete_topic(args.topic)
    except KafkaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{args.action}d topic {args.topic}")
    return 0


def _groups(args: argparse.Namespace) -> int:
    return int(_admin_command(_groups_action)(args))


def _groups_action(admin: Any, args: argparse.Namespace) -> int:
    from oncelog.client.errors import KafkaConnectionError, KafkaError

    if args.action == "list":
        for g in admin.list_groups():
            print(f"{g.group_id}\t{g.state or '-'}\t{g.protocol_type or '-'}")
        return 0
    if args.action == "delete":
        try:
            admin.delete_group(args.group)
        except KafkaConnectionError:
            raise
        except KafkaError as exc:
            print(f"error: {exc.name}", file=sys.stderr)
            return 1
        print(f"deleted group {args.group}")
        return 0
    if args.action == "describe":
        try:
            info = admin.describe_group(args.group)
        except KafkaConnectionError:
            raise
        except KafkaError:
            info = None
        if info is None or info.state == "Dead":
            print(f"group {args.group} not found", file=sys.stderr)
            return 1
        protocol = "/".join(x for x in (info.protocol_type, info.protocol) if x) or "-"
        print(f"Group: {info.group_id}\tState: {info.state}\tProtocol: {protocol}\tMembers: {len(info.members)}")
        for m in info.members:
            parts = ", ".join(f"{t}-{p}" for t, ps in sorted(m.assignment.items()) for p in sorted(ps)) or "-"
            instance = m.group_instance_id or "-"
            print(f"\tMember: {m.member_id}\tInstance: {instance}\tClient: {m.client_id}\tHost: {m.client_host}"
                  f"\tAssignment: {parts}")
        print("TOPIC\tPARTITION\tCOMMITTED\tLOG-END\tLAG\tMEMBER")
        for row in admin.group_lag(args.group):
            committed = "-" if row["committed"] is None else row["committed"]
            lag = "-" if row["lag"] is None else row["lag"]
            print(f"{row['topic']}\t{row['partition']}\t{committed}\t{row['log_end']}\t{lag}\t{row['member'] or '-'}")
        return 0
    # reset-offsets
    targets = [t for t in (args.to_earliest and "earliest", args.to_latest and "latest",
                           args.to_offset is not None and f"offset:{args.to_offset}",
                           args.shift_by is not None and f"shift:{args.shift_by}") if t]
    if len(targets) != 1 or not args.topic:
        print("error: reset-offsets needs --topic and one of --to-earliest, --to-latest, --to-offset, --shift-by",
              file=sys.stderr)
        return 2
    plan = admin.plan_offset_reset(args.group, args.topic, targets[0], args.partitions)
    for (topic, p), offset in sorted(plan.items()):
        print(f"{topic}\t{p}\t{offset}")
    if not args.execute:
        print("(dry run: add --execute to commit these offsets)")
        return 0
    errors = {tp: e.name for tp, e in admin.alter_group_offsets(args.group, plan).errors.items()}
    if errors:
        for (topic, p), err in sorted(errors.items()):
            print(f"error: {topic}-{p}: {err}", file=sys.stderr)
        if "UNKNOWN_MEMBER_ID" in errors.values():
            print("(offsets can be reset only while the group has no members)", file=sys.stderr)
        return 1
    print(f"reset offsets of group {args.group}")
    return 0


# -- txns (KIP-664) -------------------------------------------------------------


def _table(title: str, headers: list[str], rows: list[list[Any]]) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal:
        console = Console(highlight=False, soft_wrap=True, width=max(console.width, 250))
    table = Table(title=title, box=box.SIMPLE, title_justify="left")
    for h in headers:
        table.add_column(h, no_wrap=True)
    for row in rows:
        table.add_row(*(Text("-" if v is None else str(v)) for v in row))
    console.print(table)


def _txns(args: argparse.Namespace) -> int:
    return int(_admin_command(_txns_action)(args))


def _txns_action(admin: Any, args: argparse.Namespace) -> int:
    from oncelog.client.txns import AbortSpec

    now = admin.clock()
    if args.action == "list":
        rows = [vars(r) for r in admin.list_transactions(args.state or (), args.producer_id or (),
                                                         -1 if args.duration_ms is None else args.duration_ms)]
        if args.json:
            print(json.dumps(rows))
        else:
            _table("Transactions", ["TransactionalId", "Coordinator", "ProducerId", "State"],
                   [[r["transactional_id"], r["coordinator"], r["producer_id"], r["state"]] for r in rows])
        return 0
    if args.action == "describe":
        found = admin.describe_transactions(args.transactional_ids)
        failed = found.errors
        for tid, err in failed.items():
            print(f"error: failed to describe transactional id {tid!r}: {err.name}", file=sys.stderr)
        ok = list(found.succeeded.values())
        if args.json:
            print(json.dumps([d.to_json(now) for d in ok]))
        else:
            _table("Transactions", ["CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch", "State",
                                    "TimeoutMs", "StartTimeMs", "DurationMs", "Partitions"],
                   [[d.coordinator_id, d.transactional_id, d.producer_id, d.producer_epoch, d.state, d.timeout_ms,
                     d.start_time_ms if d.start_time_ms >= 0 else None,
                     now - d.start_time_ms if d.start_time_ms >= 0 else None,
                     ",".join(f"{t}-{p}" for t, p in d.partitions)] for d in ok])
        return 1 if failed else 0
    if args.action == "find-hanging":
        if args.partition is not None and args.topic is None:
            print("error: --partition needs --topic", file=sys.stderr)
            return 1
        hanging = admin.find_hanging(args.topic, args.partition, args.max_transaction_timeout_ms, args.margin_ms)
        now = admin.clock()
        if args.json:
            print(json.dumps([h.to_json(now) for h in hanging]))
        else:
            _table("Hanging transactions", ["Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch",
                                            "StartOffset", "LastTimestamp", "Duration(ms)", "TransactionalId",
                                            "Reason"],
                   [[h.topic, h.partition, h.producer.producer_id, h.producer.producer_epoch,
                     h.producer.coordinator_epoch, h.producer.current_txn_start_offset, h.producer.last_timestamp,
                     now - h.producer.last_timestamp, h.transactional_id, h.reason] for h in hanging])
        return 0
    # abort
    explicit = (args.producer_id, args.producer_epoch, args.coordinator_epoch)
    if args.start_offset is not None:
        if any(x is not None for x in explicit):
            print("error: give either --start-offset or --producer-id/--producer-epoch/--coordinator-epoch",
                  file=sys.stderr)
            return 1
        spec = admin.abort_spec(args.topic, args.partition, args.start_offset)
    elif all(x is not None for x in explicit):
        # a producer that never completed a transaction reports coordinator epoch -1: use 0, as Kafka's tool does
        spec = AbortSpec(args.topic, args.partition, args.producer_id, args.producer_epoch,
                         max(args.coordinator_epoch, 0))
    else:
        print("error: the transaction to abort must be identified either with --start-offset or with "
              "--producer-id, --producer-epoch and --coordinator-epoch", file=sys.stderr)
        return 1
    admin.abort_transaction(spec)
    result = {"topic": spec.topic, "partition": spec.partition, "producer_id": spec.producer_id,
              "producer_epoch": spec.producer_epoch, "coordinator_epoch": spec.coordinator_epoch, "aborted": True}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"aborted the transaction of producer {spec.producer_id} (epoch {spec.producer_epoch}, "
              f"coordinator epoch {spec.coordinator_epoch}) on {spec.topic}-{spec.partition}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from oncelog.verify import main as verify_main

    return verify_main(args)


def _chaos(args: argparse.Namespace) -> int:
    from oncelog.chaos.runner import main as chaos_main

    return chaos_main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="oncelog", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"oncelog {__version__}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the broker in the foreground",
                           description="Run the broker in the foreground until SIGTERM or SIGINT.")
    serve.add_argument("--listen", default=None, type=_listen, metavar="HOST:PORT",
                       help="address to listen on, [NAME://]HOST:PORT (default 127.0.0.1:9092; overrides listeners, "
                            "whose listener name is kept when NAME:// is left out)")
    serve.add_argument("--data-dir", default=None, metavar="DIR",
                       help="log directory, locked while the broker runs (default ./data; overrides log.dirs)")
    serve.add_argument("--config", default=None, metavar="FILE",
                       help="Kafka-style properties file (see docs/configuration.md)")
    serve.add_argument("--log-level", default="info", type=str.lower, choices=LOG_LEVELS,
                       help="log verbosity: %(choices)s (default %(default)s)")
    serve.set_defaults(func=_serve)

    bootstrap_help = "HOST:PORT of the broker (default: --command-config's bootstrap.servers, else 127.0.0.1:9092)"
    command_config_help = ("client properties file, as Kafka's tools take: security.protocol, ssl.*, sasl.* "
                           "(Java's names too: sasl.jaas.config, PEM trust and key stores; see docs/client.md)")
    topics = sub.add_parser("topics", help="create, list, describe or delete topics, delete records")
    topics.add_argument("action", choices=["create", "list", "describe", "delete", "delete-records"],
                        help="what to do")
    topics.add_argument("topic", nargs="?", help="topic name (create, describe, delete, delete-records)")
    topics.add_argument("--bootstrap", default=None, type=_bootstrap, help=bootstrap_help)
    topics.add_argument("--command-config", metavar="FILE", help=command_config_help)
    topics.add_argument("--partitions", type=int, default=-1,
                        help="create: number of partitions (default: the broker's num.partitions)")
    topics.add_argument("--replication-factor", type=int, default=-1,
                        help="create: replication factor (default: the broker's default.replication.factor)")
    topics.add_argument("--config", action="append", type=_topic_config, metavar="KEY=VALUE",
                        help="create: topic config, e.g. retention.ms=86400000 (repeatable)")
    topics.add_argument("--partition", metavar="P", help="delete-records: only this partition (default: all)")
    topics.add_argument("--offset", metavar="OFFSET",
                        help="delete-records: delete the records below this offset (-1: the high watermark)")
    topics.add_argument("--offset-json-file", metavar="FILE",
                        help="delete-records: the JSON file of Kafka's kafka-delete-records.sh "
                        '({"partitions": [{"topic": ..., "partition": ..., "offset": ...}], "version": 1})')
    topics.set_defaults(func=_topics)

    groups = sub.add_parser("groups", help="list, describe (members, assignment, lag), delete groups, reset offsets")
    groups.add_argument("action", choices=["list", "describe", "delete", "reset-offsets"], help="what to do")
    groups.add_argument("group", nargs="?", help="group id (describe, delete, reset-offsets)")
    groups.add_argument("--bootstrap", default=None, type=_bootstrap, help=bootstrap_help)
    groups.add_argument("--command-config", metavar="FILE", help=command_config_help)
    groups.add_argument("--topic", help="reset-offsets: the topic")
    groups.add_argument("--partitions", type=_partitions, metavar="P[,P...]",
                        help="reset-offsets: comma-separated partitions (default all)")
    groups.add_argument("--to-earliest", action="store_true", help="reset-offsets: to the log start offset")
    groups.add_argument("--to-latest", action="store_true", help="reset-offsets: to the log end offset")
    groups.add_argument("--to-offset", type=int, metavar="OFFSET", help="reset-offsets: to this offset")
    groups.add_argument("--shift-by", type=int, metavar="N",
                        help="reset-offsets: move the committed offset by N (negative: back)")
    groups.add_argument("--execute", action="store_true", help="reset-offsets: commit (default: only show the plan)")
    groups.set_defaults(func=_groups)

    txns = sub.add_parser("txns", help="list, describe, find hanging and abort transactions (KIP-664)")
    common = _Parser(add_help=False)
    common.add_argument("--bootstrap", default=None, type=_bootstrap, help=bootstrap_help)
    common.add_argument("--command-config", metavar="FILE", help=command_config_help)
    common.add_argument("--json", action="store_true", help="print JSON instead of a table")
    tsub = txns.add_subparsers(dest="action", required=True)
    t_list = tsub.add_parser("list", parents=[common], help="list transactions on every broker")
    t_list.add_argument("--state", action="append", help="only this state, e.g. Ongoing (repeatable)")
    t_list.add_argument("--producer-id", type=int, action="append", help="only this producer id (repeatable)")
    t_list.add_argument("--duration-ms", type=int, help="only transactions open at least this long")
    t_desc = tsub.add_parser("describe", parents=[common], help="describe transactional ids at their coordinator")
    t_desc.add_argument("transactional_ids", nargs="+", metavar="TXN_ID", help="transactional id(s) to describe")
    t_hang = tsub.add_parser("find-hanging", parents=[common],
                             help="open transactions older than the max transaction timeout that pin the LSO")
    t_hang.add_argument("--topic", help="only this topic (default: all topics)")
    t_hang.add_argument("--partition", type=int, help="only this partition (needs --topic)")
    t_hang.add_argument("--max-transaction-timeout-ms", type=int, default=900_000,
                        help="the brokers' transaction.max.timeout.ms (default 900000)")
    t_hang.add_argument("--margin-ms", type=int, default=0, help="extra time before a transaction counts as hanging")
    t_abort = tsub.add_parser("abort", parents=[common], help="abort a hanging transaction on one partition")
    t_abort.add_argument("--topic", required=True, help="topic of the partition with the open transaction")
    t_abort.add_argument("--partition", type=int, required=True, help="the partition with the open transaction")
    t_abort.add_argument("--start-offset", type=int, help="first offset of the open transaction to abort")
    t_abort.add_argument("--producer-id", type=int, help="producer id of the transaction (with the two epochs)")
    t_abort.add_argument("--producer-epoch", type=int, help="producer epoch of the transaction")
    t_abort.add_argument("--coordinator-epoch", type=int, help="coordinator epoch of the transaction")
    txns.set_defaults(func=_txns)

    from oncelog.verify import add_arguments as verify_arguments

    verify = sub.add_parser("verify", help="audit an exactly-once copy: lost, duplicated, aborted-visible, "
                            "out-of-order records, group offsets ahead (exit 1 on any)")
    verify_arguments(verify)
    verify.set_defaults(func=_verify)

    from oncelog.chaos.runner import add_arguments as chaos_arguments

    chaos = sub.add_parser("chaos", help="transactional copiers under seeded broker/copier bounces and network "
                           "faults, audited by verify (exit 0 only with zero anomalies and every record copied)")
    chaos_arguments(chaos)
    chaos.set_defaults(func=_chaos)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "topics" and args.action in ("create", "describe", "delete") and not args.topic:
        parser.error(f"topics {args.action} needs a topic name")
    if args.command == "groups" and args.action != "list" and not args.group:
        parser.error(f"groups {args.action} needs a group id")
    if args.command == "topics" and args.action == "list" and args.topic:
        parser.error(f"topics list takes no topic name (got {args.topic!r})")
    if args.command == "groups" and args.action == "list" and args.group:
        parser.error(f"groups list takes no group id (got {args.group!r})")
    if hasattr(args, "command_config"):  # the commands that connect as a client
        try:
            _client_settings(args)
        except _UsageError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    stdout = sys.stdout
    sys.stdout = _Stdout(stdout)  # type: ignore[assignment]
    try:
        result = int(args.func(args) or 0)
        sys.stdout.flush()
        return result
    except _StdoutClosed:
        # stop quietly; the interpreter's exit-time flush must not complain either
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), stdout.fileno())
        return 1
    finally:
        sys.stdout = stdout


if __name__ == "__main__":
    sys.exit(main())
