#!/usr/bin/env python3
"""glm5: day-2 operations on the GLM-5 inference node(s) of an Ansible inventory, over SSH (Fabric).

    glm5 status                   one screen per node, below the gateway's section when the inventory has a gateway;
                                  exit 1 when anything is wrong (for cron and monitors)
    glm5 gpus [--watch]           the per-GPU table (utilisation, power / limit, memory, temperature, clocks)
    glm5 logs [-f] [--since T]    the SGLang unit's journal
    glm5 bench [--levels 1,64] [--lengths 256/128]
                                  the smoke test's probe and sweep on demand (ansible/playbooks/bench.yml: the
                                  sglang_smoke role, its report folder), a progress bar per level
    glm5 history                  the node's runs in the bench history
    glm5 compare [RUN [RUN]]      two runs side by side (table + plot), the last two by default
    glm5 restart [--force]        graceful: the unit drains and stops, starts, and /health_generate answers;
                                  behind a gateway, the last node serving there is refused unless --force
    glm5 fleet [-g GATEWAY]       the gateway's view: a row per node (worker URL, healthy, status, requests in flight
                                  through the gateway, circuit breaker, drained by an operator), nodes it does not
                                  route to marked out; exit 1 when a node that is not drained is out or unhealthy
    glm5 drain NODE [--timeout S] [--force]
                                  take NODE out of every gateway in front of it and mark it drained there (a deploy
                                  leaves it out, a gateway restart takes it out again), then wait until its own
                                  in-flight requests are done (default: sglang_gateway_drain_timeout, 900 s); exit 1
                                  when they are not (it stays drained). Draining a drained node says so; the last
                                  node serving through a gateway (the others out or unhealthy) is refused, nothing
                                  changed, unless --force (or the gateway's sglang_gateway_allow_outage)
    glm5 undrain NODE [--timeout S]
                                  no longer drained, back into every gateway in front of it (with the node's key, read
                                  on the node), and healthy there (default: sglang_gateway_join_timeout, 120 s)

Every subcommand takes -i INVENTORY (default: the lab, inventories/lab), -n NODE (an inference_nodes host; needed
when the inventory has several and the subcommand acts on one) and --json. Hosts, ports, keys, paths and the PVE
API come from the inventory through Ansible's own inventory and variable code (role defaults under it, templates
rendered), never from a second copy. Bad input and unreachable nodes give one line on stderr and a non-zero exit:
2 for bad input (an inventory without a gateway for fleet, drain and undrain), 1 for a node that is unhealthy,
unreachable or failed.

The gateway (a host of the inventory's gateways group, sglang_gateway's contract) is asked from inside its own
container over SSH, as the nodes are: its control plane at the contract's url with the key from its unit's
environment file, read there; a node's worker URL is the one the role computes (the sglang_fleet_workers filter);
the drained list is the contract's drained_file there. No key is ever printed, in --json or on a remote command line.
glm5 status --json holds the gateway's section under "gateway" (a list of sections when the inventory has several
gateways and -g picks none).
"""
from __future__ import annotations

import argparse
import os
import re
import sys

from glm5.commands import COMMANDS
from glm5.errors import OpsError
from glm5.inventory import DEFAULT_INVENTORY, Inventory
from glm5.project import stdout_reader_gone


def _levels(text):
    try:
        levels = [int(x) for x in text.split(',') if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError('--levels takes concurrency levels like 1,64,256, not {0!r}'.format(text)) from None
    if not levels or any(x < 1 for x in levels) or levels != sorted(set(levels)):
        raise argparse.ArgumentTypeError('--levels must be ascending, distinct and >= 1, got {0!r}'.format(text))
    return levels


def _number(kind, least, what):
    """An argparse type: a number of that kind, at least `least`."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or value < least:
            raise argparse.ArgumentTypeError('{0} must be a number >= {1}, not {2!r}'.format(what, least, text))
        return value
    return parse


def _lengths(text):
    m = re.match(r'^\s*(\d+)\s*/\s*(\d+)\s*$', text)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise argparse.ArgumentTypeError('--lengths takes INPUT/OUTPUT tokens like 256/128, not {0!r}'.format(text))
    return int(m.group(1)), int(m.group(2))


def parser():
    def options(suppress):
        # before or after the subcommand alike; after it, only what is given overrides what came before
        common = argparse.ArgumentParser(add_help=False)
        default = (lambda value: argparse.SUPPRESS) if suppress else (lambda value: value)
        common.add_argument('-i', '--inventory', default=default(DEFAULT_INVENTORY),
                            help='the Ansible inventory (default: the lab, {0})'.format(DEFAULT_INVENTORY))
        common.add_argument('-n', '--node', default=default(None),
                            help='one host of inference_nodes (default: all, or the only one)')
        common.add_argument('--json', action='store_true', default=default(False), help='JSON instead of tables')
        common.add_argument('--vault-password-file', action='append', default=default([]), metavar='FILE',
                            help="for an inventory with vaulted secrets, as ansible-playbook's")
        common.add_argument('--ask-vault-pass', action='store_true', default=default(False),
                            help='ask for the vault password')
        return common

    common = options(True)
    p = argparse.ArgumentParser(prog='glm5', description=__doc__.splitlines()[0], parents=[options(False)],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog='\n'.join(__doc__.splitlines()[2:]))
    sub = p.add_subparsers(dest='command', metavar='COMMAND', required=True)
    st = sub.add_parser('status', parents=[common], help='one screen per node (and gateway); exit 1 when anything is wrong')
    st.add_argument('-g', '--gateway', help='the gateway whose section is shown (default: every gateway)')
    g = sub.add_parser('gpus', parents=[common], help='the per-GPU table')
    g.add_argument('--watch', action='store_true', help='refresh until Ctrl-C')
    g.add_argument('--interval', type=_number(float, 0.1, '--interval'), default=2.0,
                   help='seconds between refreshes (default %(default)s)')
    g.add_argument('--count', type=_number(int, 0, '--count'), default=0,
                   help='with --watch: stop after this many tables (0: until Ctrl-C)')
    lg = sub.add_parser('logs', parents=[common], help="the unit's journal")
    lg.add_argument('-f', '--follow', action='store_true', help='keep following (Ctrl-C ends)')
    lg.add_argument('--since', help='journalctl --since: "1 hour ago", "2026-11-30 12:00", today, or --since=-1h')
    lg.add_argument('--lines', type=_number(int, 1, '--lines'), default=100,
                    help='how many of the newest lines (default %(default)s)')
    b = sub.add_parser('bench', parents=[common], help="the smoke test's sweep on demand")
    b.add_argument('--levels', type=_levels, help='concurrency levels, e.g. 1,64,256 (default: the inventory\'s)')
    b.add_argument('--lengths', type=_lengths, help='INPUT/OUTPUT tokens, e.g. 1024/256 (default: the inventory\'s)')
    sub.add_parser('history', parents=[common], help='the runs in the bench history')
    c = sub.add_parser('compare', parents=[common], help='two runs side by side (default: the last two)')
    c.add_argument('runs', nargs='*', metavar='RUN', help='a run (its folder name, or a unique prefix)')
    c.add_argument('--out', help='where the plot goes (default: ./glm5-compare-A-vs-B.png)')
    r = sub.add_parser('restart', parents=[common], help='graceful restart: drain, stop, start, ready')
    r.add_argument('--timeout', type=_number(int, 1, '--timeout'),
                   help='seconds to wait for readiness, and for the drain and the join behind a gateway (default: '
                        'sglang_service_ready_timeout, sglang_gateway_drain_timeout, sglang_gateway_join_timeout)')
    r.add_argument('--force', action='store_true',
                   help='restart it even when it is the last node serving through its gateway')
    f = sub.add_parser('fleet', parents=[common], help="the gateway's view of the nodes")
    f.add_argument('-g', '--gateway', help='a host of gateways (default: the only one)')
    for what, default, text in (('drain', 'sglang_gateway_drain_timeout', 'out of the gateways, in-flight requests done'),
                                ('undrain', 'sglang_gateway_join_timeout', 'back into the gateways, healthy there')):
        d = sub.add_parser(what, parents=[common], help=text)
        d.add_argument('target', nargs='?', metavar='NODE', help='the inference node (or -n NODE)')
        d.add_argument('--timeout', type=_number(int, 1, '--timeout'),
                       help='seconds to wait (default: {0})'.format(default))
        if what == 'drain':
            d.add_argument('--force', action='store_true',
                           help='drain it even when it is the last node serving through its gateway')
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        inv = Inventory(os.path.abspath(args.inventory), args.vault_password_file, args.ask_vault_pass)
        rc = COMMANDS[args.command](args, inv)
        sys.stdout.flush()              # a reader that has gone is found here, not as Python exits
        return rc
    except OpsError as exc:
        print('glm5: {0}'.format(exc), file=sys.stderr)
        return exc.code
    except BrokenPipeError:
        return stdout_reader_gone()
    except KeyboardInterrupt:       # where a command changes something, it says where it left it (Interrupted)
        print('glm5: interrupted', file=sys.stderr)
        return 130
    except (OSError, EOFError) as exc:
        print('glm5: {0}'.format(exc), file=sys.stderr)
        return 1


if __name__ == '__main__':
    sys.exit(main())
