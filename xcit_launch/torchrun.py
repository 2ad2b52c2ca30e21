"""torchrun, as the launch scripts run it: the same arguments, three additions.

- Under the c10d rendezvous (restarts), the node that becomes rank 0 of a round tells the others
  where its workers' store is; left to itself it names its host name, which on many hosts resolves
  to a loopback address on every node. Unless ``--local-addr`` is given, this node's address on the
  route to the rendezvous endpoint is passed instead.
- A rendezvous that does not complete (a node never joins, the master cannot be reached) ends
  with one line naming the rendezvous, the nodes expected and the timeout.
- A failed run ends with one line naming the first rank that failed, instead of torchrun's
  traceback and report, so the worker's own error above stays the one to read.

Usage: python tools/torchrun.py [torchrun arguments] SCRIPT [script arguments]
(torch is imported only by ``main``, when the run starts.)
"""
import logging
import re
import signal
import sys
from typing import List, Optional

from . import netif


def option(argv: List[str], *names: str) -> Optional[str]:
    """The value of a torchrun option (``--name=value`` or ``--name value``) before the script."""
    for i, arg in enumerate(argv):
        if not arg.startswith('-'):
            return None  # the training script: what follows is its own
        for name in names:
            if arg.startswith(name + '='):
                return arg.split('=', 1)[1]
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
    return None


def rdzv_conf(argv: List[str]) -> dict:
    """``--rdzv-conf key=value,...`` as a dict."""
    text = option(argv, '--rdzv-conf', '--rdzv_conf') or ''
    return dict(item.split('=', 1) for item in text.split(',') if '=' in item)


def endpoint(argv: List[str]) -> str:
    """The rendezvous endpoint ``host:port``: given, else the master's address and port."""
    given = option(argv, '--rdzv-endpoint', '--rdzv_endpoint')
    if given:
        return given
    return f"{option(argv, '--master-addr', '--master_addr') or '127.0.0.1'}:" \
           f"{option(argv, '--master-port', '--master_port') or 29500}"


class EndpointUnreachable(OSError):
    """No route from this node leads to the rendezvous endpoint; the message says what to set."""


def with_local_addr(argv: List[str]) -> List[str]:
    """``argv`` plus ``--local-addr`` for a c10d rendezvous with a remote endpoint (see above);
    raises EndpointUnreachable when no route leads to the endpoint."""
    backend = option(argv, '--rdzv-backend', '--rdzv_backend') or 'static'
    if backend != 'c10d' or option(argv, '--local-addr', '--local_addr'):
        return argv
    host = endpoint(argv).rsplit(':', 1)[0].strip('[]')
    if netif.is_loopback(host):
        return argv
    try:
        route = netif.route_to(host)
    except OSError as exc:
        raise EndpointUnreachable(f'the rendezvous endpoint {host} cannot be reached from this node ({exc}): '
                                  f'set MASTER_ADDR to node 0\'s address') from exc
    return [f'--local-addr={route.address}', *argv]


RDZV_FAILURES = ('RendezvousTimeoutError', 'RendezvousConnectionError', 'RendezvousClosedError',
                 'DistStoreError', 'DistNetworkError')


def rendezvous_failure(exc: BaseException, argv: List[str]) -> Optional[str]:
    """The one-line report of a rendezvous that did not complete, or None for another failure."""
    chain, cause = [], exc
    while cause is not None and len(chain) < 5:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    failure = next((e for e in chain if type(e).__name__ in RDZV_FAILURES
                    or re.search(r'waiting for clients', str(e))), None)
    if failure is None:
        return None
    backend = option(argv, '--rdzv-backend', '--rdzv_backend') or 'static'
    conf = rdzv_conf(argv)
    timeout = conf.get('join_timeout' if backend == 'c10d' else 'timeout', '600')
    nnodes = option(argv, '--nnodes') or '1'
    detail = ' '.join(str(failure).split())[:300]
    detail = f'{type(failure).__name__}: {detail}' if detail else type(failure).__name__
    return (f'error: the {backend} rendezvous at {endpoint(argv)} did not complete: {nnodes} node(s) '
            f'expected, waited RDZV_TIMEOUT={timeout} s ({detail}). Start '
            f'every node with the same MASTER_ADDR, PORT and NNODES, and check that they reach '
            f'{endpoint(argv)}.')


def main(argv: List[str]) -> int:
    """Run torchrun with ``argv``; 1, after one line naming the failure, when the run failed or
    could not start."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run
    # its per-process notes on the tear-down ("closing signal", "failed (exitcode ...)")
    logging.getLogger('torch.distributed.elastic.multiprocessing.api').setLevel(logging.CRITICAL)
    try:
        argv = with_local_addr(argv)
    except EndpointUnreachable as exc:
        print(f'error: {exc}', file=sys.stderr, flush=True)
        return 1
    try:
        run(parse_args(argv))
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        if failure.exitcode == -signal.SIGKILL:  # no error of its own above
            print(f'error: rank {rank} (pid {failure.pid}) was killed by signal 9: likely out of memory (the '
                  f"kernel's out-of-memory killer: see dmesg on its host)", file=sys.stderr, flush=True)
            return 1
        how = f'signal {failure.signal_name()}' if failure.exitcode < 0 else f'exit code {failure.exitcode}'
        print(f'error: rank {rank} (pid {failure.pid}) failed first ({how}); its error is above',
              file=sys.stderr, flush=True)
        return 1
    except Exception as exc:  # noqa: B902  (name a rendezvous failure; re-raise anything else)
        message = rendezvous_failure(exc, argv)
        if message is None:
            raise
        print(message, file=sys.stderr, flush=True)
        return 1
    return 0
