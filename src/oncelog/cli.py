"""``oncelog serve|topics``: the broker and a small admin CLI that speaks the protocol."""

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
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "action", None) in ("create", "describe", "delete") and not args.topic:
        parser.error(f"topics {args.action} needs a topic name")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
