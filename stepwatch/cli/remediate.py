"""``stepwatch remediate``: the guarded remediator service and its operator commands."""

from __future__ import annotations

import argparse
import json
import signal
import threading
from typing import Any

from stepwatch.cli.common import default_of

DESCRIPTION = """\
serve          receive Alertmanager webhooks and act per the policy (observe mode,
               a dry run, unless the policy or --mode says recommend or execute)
check-policy   validate a policy file and print what it says
list           show recent actions (--status queued: those awaiting approval)
outcomes       show what became of executed remediations (recovered, not_recovered,
               or pending until the alert resolves or the deadline passes)
approve ID     run a queued action now, after every check again (refused when
               the breaker is open, the rate limit is spent, the node was drained
               by a person, the node no longer runs the job, ...)
close-breaker  close the circuit breaker after a person has looked

The operator commands talk to the running service at --url with your own
operator token (--token-file, STEPWATCH_REMEDIATE_OPERATOR_TOKEN_FILE or
STEPWATCH_REMEDIATE_OPERATOR_TOKEN), one of the service's --operators-file; the
service records you as the operator who acted. The webhook token (Alertmanager's)
is refused there. See docs/remediation.md.
"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "remediate",
        help="the guarded remediator (Alertmanager webhook -> Slurm/Kubernetes)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="remediate_command", metavar="ACTION", required=True)
    serve = sub.add_parser("serve", help="run the service in the foreground")
    serve.add_argument(
        "--policy", dest="remediate_policy", help="policy YAML (env STEPWATCH_REMEDIATE_POLICY)"
    )
    serve.add_argument(
        "--mode",
        dest="remediate_mode",
        choices=("observe", "recommend", "execute"),
        help="override the policy's mode",
    )
    serve.add_argument(
        "--port",
        dest="remediate_port",
        type=int,
        help=f"listen port (default {default_of('remediate_port')})",
    )
    serve.add_argument(
        "--bind",
        dest="remediate_bind",
        help=f"listen address (default {default_of('remediate_bind')})",
    )
    serve.add_argument("--state-dir", dest="remediate_state_dir", help="where the state file lives")
    serve.add_argument(
        "--token-file",
        dest="remediate_token_file",
        help="file holding the webhook's bearer token (Alertmanager's; the webhook only)",
    )
    serve.add_argument(
        "--operators-file",
        dest="remediate_operators_file",
        help="file of name:token lines, one per operator (approve, close-breaker, list); "
        "unset: the operator commands are refused",
    )
    serve.add_argument(
        "--bootstrap-servers",
        help="Kafka for the audit topic, which the store's sink records "
        "(empty: no audit beyond the metric)",
    )
    serve.add_argument("--topic-prefix", help="topic prefix (audit topic <prefix>.remediations)")
    serve.set_defaults(func=run_serve)
    check = sub.add_parser("check-policy", help="validate a policy file")
    check.add_argument("policy")
    check.set_defaults(func=run_check)
    for name, helptext in (
        ("list", "list recent actions"),
        ("outcomes", "list remediation outcomes"),
        ("approve", "approve a queued action"),
        ("close-breaker", "close the circuit breaker"),
    ):
        c = sub.add_parser(name, help=helptext)
        c.add_argument(
            "--url",
            dest="remediate_url",
            help=f"the service (default {default_of('remediate_url')})",
        )
        c.add_argument(
            "--token-file",
            dest="remediate_operator_token_file",
            help="file holding your operator token (env STEPWATCH_REMEDIATE_OPERATOR_TOKEN_FILE)",
        )
        if name == "list":
            c.add_argument(
                "--status", help="only this status (queued, done, dry_run, failed_transient, ...)"
            )
        if name == "approve":
            c.add_argument("action_id")
        c.set_defaults(func=run_client)


def run_serve(args: argparse.Namespace) -> int:
    from stepwatch.alerts.remediate.service import build
    from stepwatch.cli.common import settings_from_args

    settings = settings_from_args(args)
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    service = build(settings)
    print(
        f"remediator ready url={service.url} mode={service.server.remediator.mode.value}",
        flush=True,
    )
    try:
        stop.wait()
        return 0
    finally:
        service.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_check(args: argparse.Namespace) -> int:
    from stepwatch.alerts.remediate.policy import load

    policy = load(args.policy)
    g = policy.guardrails
    print(
        f"policy ok: mode={policy.mode.value} rules={len(policy.rules)} "
        f"actuator={policy.actuator.get('kind')} "
        f"breaker={g.breaker_max_share:.0%}/{g.breaker_window_s:.0f}s "
        f"rate={g.rate_limit}/{g.rate_window_s:.0f}s webhook_cap={g.max_alerts_per_webhook} "
        f"notify={g.notify_total}/{g.notify_window_s:.0f}s (per owner {g.notify_per_owner}) "
        f"outcome_deadline={policy.outcome.deadline_s:.0f}s "
        f"confirm_firing={'on' if policy.confirms_firing else 'off'}"
    )
    return 0


def run_client(args: argparse.Namespace) -> int:
    from stepwatch.alerts.remediate.client import Client
    from stepwatch.alerts.remediate.service import read_operator_token
    from stepwatch.cli.common import settings_from_args

    settings = settings_from_args(args)
    client = Client(settings.remediate_url, read_operator_token(settings))
    if args.remediate_command == "list":
        result: Any = client.actions(args.status)
    elif args.remediate_command == "outcomes":
        result = client.outcomes()
    elif args.remediate_command == "approve":
        result = client.approve(args.action_id)
    else:
        result = client.close_breaker()
    print(json.dumps(result, indent=2))
    return 0
