"""``epochsync agent``: run the agent on a Gluster server, check its config, ask one what it serves.

- ``epochsync agent serve --config /etc/epochsync/agent.yaml``: the agent (the systemd unit runs this);
- ``epochsync agent check --config ...``: reads the config as the agent will (the secret file and
  its mode, each brick on btrfs and its snapshot folder, the TLS files) and says what it would serve;
- ``epochsync agent info --url https://node1:7411 --secret-file F [--ca F]``: asks a running agent,
  over the network and signed, for its version, bricks, snapshots and limits.
"""

from __future__ import annotations

import json
import os
import signal

from epochsync.core.errors import ConfigError


def configure_agent(parser) -> None:
    """Add the ``agent`` verb's actions to ``parser``."""
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, help_ in (
        ("serve", "run the agent (as root, on the Gluster server)"),
        ("check", "check the agent's config here and say what it would serve"),
    ):
        p = sub.add_parser(name, help=help_, description=help_)
        p.add_argument("--config", default="/etc/epochsync/agent.yaml", help="the agent's config (YAML)")
    p = sub.add_parser(
        "info", help="ask a running agent what it serves", description="ask a running agent what it serves"
    )
    p.add_argument("--url", required=True, help="the agent, http(s)://host:port")
    p.add_argument("--secret-file", help="the shared secret (default: $EPOCHSYNC_AGENT_SECRET)")
    p.add_argument("--ca", help="the CA that signed the agent's certificate (https)")
    p.add_argument("--cert", help="this client's certificate, when the agent asks for one")
    p.add_argument("--key", help="its key")
    p.add_argument("--format", choices=("table", "json"), default="table")


def run_agent(args) -> int:
    """Runs ``epochsync agent ACTION``; returns the exit status."""
    from epochsync.agent.server import AgentConfig, Bricks, serve

    if args.action == "info":
        return _info(args)
    cfg = AgentConfig.load(args.config)
    if args.action == "check":
        cfg.secret()
        for f in (cfg.tls_cert, cfg.tls_key, cfg.tls_ca):
            if f and not os.access(f, os.R_OK):
                raise ConfigError(args.config, "tls", f"cannot read {f}")
        bricks = Bricks(cfg)
        print(f"agent config {args.config}: ok")
        print(
            f"  listens on {cfg.listen} ({'TLS' if cfg.tls_cert else 'plain HTTP'}"
            f"{', client certificates from ' + cfg.tls_ca if cfg.tls_ca else ''}); signed requests only"
        )
        print(f"  at most {cfg.max_requests} requests at once; log: {cfg.log or 'stderr'}")
        for b, (sub, _rel, folder) in bricks.layout.items():
            print(f"  brick {b}: subvolume {sub}, snapshots in {folder} ({len(bricks.snapshots(b))} kept)")
        return 0

    def stop(_sig, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        serve(cfg)
    except KeyboardInterrupt:
        pass
    return 0


def _info(args) -> int:
    from pathlib import Path

    from epochsync.agent.client import AgentClient

    if args.secret_file:
        try:
            secret = Path(args.secret_file).read_bytes().strip()
        except OSError as exc:
            raise ConfigError("--secret-file", args.secret_file, exc.strerror or str(exc)) from None
    else:
        secret = os.environ.get("EPOCHSYNC_AGENT_SECRET", "").encode()
    if not secret:
        raise ConfigError(
            "agent info",
            "--secret-file",
            "no secret: --secret-file F or $EPOCHSYNC_AGENT_SECRET (the agent refuses unsigned requests)",
        )
    info = AgentClient(args.url, secret, ca=args.ca, cert=args.cert, key=args.key).info()
    if args.format == "json":
        print(json.dumps(info, indent=1))
        return 0
    print(
        f"agent {args.url}: epochsync {info.get('version')}, {info.get('max_requests')} requests at once, "
        f"{'TLS' if info.get('tls') else 'plain HTTP'}{' with client certificates' if info.get('client_certificates') else ''}"
    )
    for b, doc in (info.get("bricks") or {}).items():
        snaps = doc.get("snapshots") or []
        print(f"  brick {b}: {len(snaps)} snapshots" + (f" ({snaps[0]} .. {snaps[-1]})" if snaps else ""))
    return 0
