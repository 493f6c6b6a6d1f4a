"""``oncelog serve|topics|groups``: the broker and a small admin CLI that speaks the protocol."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from oncelog.broker.config import parse_listener


def _serve(args: argparse.Namespace) -> int:
    from oncelog.broker.config import BrokerConfig
    from oncelog.broker.server import run

    overrides: dict[str, Any] = {}
    if args.listen:
        overrides["host"], overrides["port"] = parse_listener(args.listen)
    if args.data_dir:
        overrides["data_dir"] = Path(args.data_dir)
    config = BrokerConfig.load(args.config, **overrides)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    run(config)
    return 0


def _topics(args: argparse.Namespace) -> int:
    from oncelog.client.admin import Admin

    with Admin(args.bootstrap) as admin:
        if args.action == "list":
            for name in sorted(admin.list_topics()):
                print(name)
            return 0
        if args.action == "create":
            configs = dict(c.split("=", 1) for c in args.config or [])
            err = admin.create_topic(args.topic, args.partitions, args.replication_factor, configs)
        elif args.action == "delete":
            err = admin.delete_topic(args.topic)
        else:
            info = admin.describe_topic(args.topic)
            if info is None:
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
        if err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        print(f"{args.action}d topic {args.topic}")
        return 0


def _groups(args: argparse.Namespace) -> int:
    from oncelog.client.groups import GroupAdmin, GroupAdminError

    with GroupAdmin(args.bootstrap) as admin:
        try:
            return _groups_action(admin, args)
        except GroupAdminError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1


def _groups_action(admin: Any, args: argparse.Namespace) -> int:
    if args.action == "list":
        for g in sorted(admin.list_groups(), key=lambda g: g["group_id"]):
            print(f"{g['group_id']}\t{g['state'] or '-'}\t{g['protocol_type'] or '-'}")
        return 0
    if args.action == "delete":
        err = admin.delete(args.group)
        if err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        print(f"deleted group {args.group}")
        return 0
    if args.action == "describe":
        info = admin.describe(args.group)
        if info.error or info.state == "Dead":
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
        for row in admin.lag(args.group):
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
    partitions = [int(p) for p in args.partitions.split(",")] if args.partitions else None
    plan = admin.plan_reset(args.group, args.topic, targets[0], partitions)
    for (topic, p), offset in sorted(plan.items()):
        print(f"{topic}\t{p}\t{offset}")
    if not args.execute:
        print("(dry run: add --execute to commit these offsets)")
        return 0
    errors = admin.commit(args.group, plan)
    if errors:
        for (topic, p), err in sorted(errors.items()):
            print(f"error: {topic}-{p}: {err}", file=sys.stderr)
        if "UNKNOWN_MEMBER_ID" in errors.values():
            print("(offsets can be reset only while the group has no members)", file=sys.stderr)
        return 1
    print(f"reset offsets of group {args.group}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="oncelog", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the broker in the foreground")
    serve.add_argument("--listen", default=None, help="HOST:PORT (default 127.0.0.1:9092)")
    serve.add_argument("--data-dir", default=None, help="log directory (default ./data)")
    serve.add_argument("--config", default=None, help="Kafka-style properties file")
    serve.add_argument("--log-level", default="info")
    serve.set_defaults(func=_serve)

    topics = sub.add_parser("topics", help="create, list, describe or delete topics")
    topics.add_argument("action", choices=["create", "list", "describe", "delete"])
    topics.add_argument("topic", nargs="?")
    topics.add_argument("--bootstrap", default="127.0.0.1:9092")
    topics.add_argument("--partitions", type=int, default=-1)
    topics.add_argument("--replication-factor", type=int, default=-1)
    topics.add_argument("--config", action="append", help="KEY=VALUE topic config (repeatable)")
    topics.set_defaults(func=_topics)

    groups = sub.add_parser("groups", help="list, describe (members, assignment, lag), delete groups, reset offsets")
    groups.add_argument("action", choices=["list", "describe", "delete", "reset-offsets"])
    groups.add_argument("group", nargs="?")
    groups.add_argument("--bootstrap", default="127.0.0.1:9092")
    groups.add_argument("--topic", help="reset-offsets: the topic")
    groups.add_argument("--partitions", help="reset-offsets: comma-separated partitions (default all)")
    groups.add_argument("--to-earliest", action="store_true")
    groups.add_argument("--to-latest", action="store_true")
    groups.add_argument("--to-offset", type=int)
    groups.add_argument("--shift-by", type=int)
    groups.add_argument("--execute", action="store_true", help="reset-offsets: commit (default: only show the plan)")
    groups.set_defaults(func=_groups)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "topics" and args.action in ("create", "describe", "delete") and not args.topic:
        parser.error(f"topics {args.action} needs a topic name")
    if args.command == "groups" and args.action != "list" and not args.group:
        parser.error(f"groups {args.action} needs a group id")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
