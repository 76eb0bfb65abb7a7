"""``stepwatch agent``: run the node agent in the foreground."""

from __future__ import annotations

import argparse
import re
import signal
import threading
from typing import Any

from stepwatch.cli.common import add_kafka_flags, add_web_flags, default_of, settings_from_args
from stepwatch.errors import ConfigError
from stepwatch.settings import AGENT_VERIFY_JOB

DESCRIPTION = """\
Run the node agent: every tick it reads the host's GPUs (NVML or dcgm-exporter),
its RDMA ports (sysfs) and the step timings training ranks send to its Unix
socket, and publishes them to Kafka (one topic per kind, keyed by job id).
Every message goes through an on-disk spool first: while Kafka is unreachable
the agent keeps collecting and spools (bounded by --spool-max-bytes; when full,
the oldest unsent data is dropped and counted), then catches up in order.
Stop with SIGTERM or Ctrl-C: a final tick, a flush, the spool position saved.

The socket is a trust boundary: only the agent's user and --socket-group may
send; the agent stamps its own host on every record, rejects records that
claim another host, or a job or rank the sending process does not run
(--verify-job), rate-limits each sending process, and counts every rejection
(stepwatch_agent_datagrams_rejected_total{reason}). Records Kafka refuses for
good are kept in <spool-dir>/dead, never retried.
"""

EPILOG = """\
Every flag falls back to its STEPWATCH_* environment variable, then to the
default (e.g. --spool-dir = STEPWATCH_SPOOL_DIR). Metrics: /metrics on
--metrics-port (stepwatch_agent_*). Deployment: docs/agent.md.
"""

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``512M`` / ``1GiB`` / ``1048576`` -> bytes."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 512M, 2G)")
    scale = 1024 ** " kmgt".index(match.group(2).lower() or " ")
    return int(float(match.group(1)) * scale)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "agent",
        help="run the node agent (GPU, RDMA, step timings -> Kafka)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_kafka_flags(p)
    for action in p._actions:
        if action.dest == "bootstrap_servers":
            action.metavar = "HOST:PORT[,...]"
            action.help = (
                "Kafka bootstrap servers (env STEPWATCH_BOOTSTRAP_SERVERS); required "
                "unless --dev-broker"
            )
    p.add_argument(
        "--dev-broker",
        action="store_true",
        help="start a local development broker (Tansu) and publish to it; "
        "for trying things out, not for production",
    )
    g = p.add_argument_group("agent")
    g.add_argument(
        "--host", metavar="NAME", help="host name stamped on every message (default: hostname)"
    )
    g.add_argument(
        "--collectors",
        metavar="NAMES",
        help="comma-separated: steps, nvml, nvml-replay, dcgm, rdma; 'none' for none "
        f"(default {default_of('collectors')})",
    )
    g.add_argument(
        "--socket",
        dest="agent_socket",
        metavar="PATH",
        help="Unix datagram socket the training ranks send to, in a directory of "
        f"its own (default {default_of('agent_socket')}); created 0750, the socket 0620",
    )
    g.add_argument(
        "--socket-group",
        dest="agent_socket_group",
        metavar="GROUP",
        help="group (name or gid) whose members may send to the socket (default: "
        "the agent's own group; put the training users in it)",
    )
    g.add_argument(
        "--verify-job",
        dest="agent_verify_job",
        choices=AGENT_VERIFY_JOB,
        help="check each record's job and rank against the sender's Slurm cgroup "
        "and environment: when_known rejects contradictions, strict also "
        "rejects senders tied to no job, off checks nothing (the host is always "
        f"checked; default {default_of('agent_verify_job')})",
    )
    g.add_argument(
        "--host-alias",
        dest="agent_host_aliases",
        metavar="NAMES",
        help="comma-separated host names ranks may also claim for this host",
    )
    g.add_argument(
        "--sender-rate",
        dest="agent_sender_rate",
        type=float,
        metavar="N",
        help="datagrams per second one process may send "
        f"(default {default_of('agent_sender_rate')}; 0: no limit)",
    )
    g.add_argument(
        "--sender-burst",
        dest="agent_sender_burst",
        type=int,
        metavar="N",
        help=f"datagrams one process may send at once (default {default_of('agent_sender_burst')})",
    )
    g.add_argument(
        "--user-rate",
        dest="agent_user_rate",
        type=float,
        metavar="N",
        help="datagrams per second all processes of one user may send (default "
        f"{default_of('agent_user_rate')}, burst STEPWATCH_AGENT_USER_BURST="
        f"{default_of('agent_user_burst')}; 0: no limit)",
    )
    g.add_argument(
        "--max-message-bytes",
        dest="agent_max_message_bytes",
        type=parse_size,
        metavar="SIZE",
        help="largest step message the agent builds per job and "
        f"tick; more steps go in more messages (default {default_of('agent_max_message_bytes')})",
    )
    g.add_argument(
        "--tick",
        dest="tick_seconds",
        type=float,
        metavar="SECONDS",
        help="seconds between polls, aligned to the wall clock "
        f"(default {default_of('tick_seconds')})",
    )
    g.add_argument(
        "--spool-dir",
        metavar="DIR",
        help=f"directory of the on-disk spool (default {default_of('spool_dir')})",
    )
    g.add_argument(
        "--spool-max-bytes",
        type=parse_size,
        metavar="SIZE",
        help=f"spool bound, a size such as 2G (default {default_of('spool_max_bytes')}); when "
        "full the oldest unsent data "
        "is dropped and counted",
    )
    g.add_argument(
        "--sysfs-root",
        metavar="DIR",
        help=f"root of the sysfs tree for RDMA counters (default {default_of('sysfs_root')})",
    )
    g.add_argument(
        "--job-map-dir",
        metavar="DIR",
        help="the Slurm prolog's hpc-job mapping directory (a file per GPU index "
        "holding its job id); the NVML collector labels GPUs with it until steps "
        f"name their job (default {default_of('job_map_dir')}; empty: none)",
    )
    g.add_argument(
        "--dcgm-url",
        metavar="URL",
        help="dcgm-exporter URL for the dcgm collector, e.g. http://localhost:9400/metrics",
    )
    g.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help=f"port of the agent's own /metrics (default {default_of('metrics_port')}; 0 disables)",
    )
    add_web_flags(g)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    fields = (
        "host",
        "collectors",
        "agent_socket",
        "tick_seconds",
        "spool_dir",
        "spool_max_bytes",
        "sysfs_root",
        "job_map_dir",
        "dcgm_url",
        "metrics_port",
        "agent_socket_group",
        "agent_verify_job",
        "agent_host_aliases",
        "agent_sender_rate",
        "agent_sender_burst",
        "agent_user_rate",
        "agent_max_message_bytes",
    )
    settings = settings_from_args(args, **{f: getattr(args, f) for f in fields})
    broker = None
    if args.dev_broker and not settings.bootstrap_servers:
        from stepwatch.daemons.broker import DEV_TOPIC_SETTINGS, DevBroker

        broker = DevBroker().start()
        settings = settings.replace(bootstrap_servers=broker.bootstrap, **DEV_TOPIC_SETTINGS)
        print(f"development broker started bootstrap={broker.bootstrap}", flush=True)
    if not settings.bootstrap_servers:
        raise ConfigError(
            "the agent needs a Kafka cluster: pass --bootstrap-servers HOST:PORT (or set "
            "STEPWATCH_BOOTSTRAP_SERVERS), or --dev-broker to start a local development broker "
            "(`stepwatch demo` starts everything for you)"
        )
    try:
        return _run_agent(settings, args.web_listen_address)
    finally:
        if broker is not None:
            broker.stop()


def _run_agent(settings: Any, listen: str = "") -> int:
    from stepwatch.agents import metrics
    from stepwatch.agents.agent import build_agent

    agent = build_agent(settings)
    stop = threading.Event()

    def _on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    server = None
    try:
        if settings.metrics_port or listen:
            from stepwatch.metrics_http import Endpoint

            endpoint = Endpoint.from_settings(settings, settings.metrics_port, listen)
            try:
                server = metrics.serve(metrics.registry_for(agent.snapshot), endpoint)
            except (OSError, ConfigError) as err:
                agent.shutdown(timeout=1.0)
                raise ConfigError(
                    f"cannot serve metrics on port {settings.metrics_port}: {err} "
                    "(--metrics-port 0 disables it)"
                ) from err
        agent.run(stop)
    finally:
        if server is not None:
            server.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
