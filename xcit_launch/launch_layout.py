"""Where a torchrun launch runs: its nodes, this node's rank, the master and its port, from the environment.

Standard library only: ``tools/launch_common.sh`` runs it (``tools/launch_layout.py``) before torchrun,
on plain machines and in Kubernetes pods alike. Each value comes from the first of:

- the user's ``NNODES``, ``NODE_RANK``, ``MASTER_ADDR`` and ``PORT`` (the launch scripts' own variables);
- a Kubeflow training-operator v1 ``PyTorchJob`` pod: ``PET_NNODES``, ``PET_NODE_RANK``,
  ``PET_MASTER_ADDR``, ``PET_MASTER_PORT`` (1.7 and later), and in every release ``MASTER_ADDR``,
  ``MASTER_PORT``, ``RANK`` (the pod's index: the master 0, worker i i+1) and ``WORLD_SIZE`` (the pods,
  or pods x ``nprocPerNode`` when that is a number); a pod is taken as one when all four are set, so
  that a stray ``MASTER_PORT`` or ``RANK`` in a user's shell changes nothing;
- a Kubeflow Trainer v2 ``TrainJob`` pod: the ``PET_*`` variables only;
- the defaults: one node, rank 0, 127.0.0.1, port 29500.

The processes per node are always the launch's ``GPUS``; an operator's ``PET_NPROC_PER_NODE`` (a
number, ``auto`` or ``gpu``: the node's GPUs, ``cpu``: CPU processes) is checked against it, so that a
manifest and a command line that disagree stop the launch rather than start another layout than the
one asked. Values that disagree (``WORLD_SIZE`` not the nodes x processes of ``PET_NNODES``), an
elastic node range (``PET_NNODES=min:max``; ``n:n`` is n) and a multi-node job that leaves this pod's
rank or the master unknown are refused with a ValueError.

The restarts of the group after a failure come from the user's ``MAX_RESTARTS``, else an elastic
policy's ``PET_MAX_RESTARTS`` (its ``maxRestarts``), else 0.
"""
import errno
import os
import re
import socket
import sys
from typing import Dict, List, Mapping, NamedTuple, Optional, Tuple

DEFAULTS = {'nnodes': 1, 'node_rank': 0, 'master_addr': '127.0.0.1', 'port': 29500}
V1_POD = ('MASTER_ADDR', 'MASTER_PORT', 'RANK', 'WORLD_SIZE')  # all set: a PyTorchJob pod
JOB_ONLY = ('MASTER_PORT', 'RANK', 'WORLD_SIZE')  # beside the PET_ ones: set by an operator, not a user
# a host name, an IPv4 address or a bare IPv6 address: nothing a shell or torchrun would split
HOST = re.compile(r'[A-Za-z0-9_.:%-]+')


class Layout(NamedTuple):
    """What torchrun is given on this node, and where each value came from (for the launch's log)."""
    nnodes: int
    node_rank: int
    master_addr: str
    port: int
    nproc_per_node: int
    max_restarts: int
    sources: Dict[str, str]  # each field above -> the variable it came from ('default': none did)

    def from_a_job(self) -> bool:
        """Whether a value came from a Kubeflow job's variables (only then is the log line printed:
        a plain launch's output stays as it was)."""
        return any('PET_' in source or source in JOB_ONLY for source in self.sources.values())

    def describe(self) -> str:
        """One line for the launch's log: each value and where it came from."""
        s = self.sources
        return (f'launch layout: {self.nnodes} node(s) ({s["nnodes"]}), node rank {self.node_rank} '
                f'({s["node_rank"]}), master {self.master_addr} ({s["master_addr"]}) port {self.port} '
                f'({s["port"]}), {self.nproc_per_node} process(es) per node ({s["nproc_per_node"]})'
                + (f', {self.max_restarts} restart(s) ({s["max_restarts"]})' if s['max_restarts'] != 'default' else ''))


def _first(env: Mapping[str, str], names: List[str]) -> Tuple[Optional[str], str]:
    """The first of ``names`` set (non-empty) in ``env``, and its name; (None, 'default') if none is."""
    for name in names:
        if env.get(name, ''):
            return env[name], name
    return None, 'default'


def _integer(name: str, text: str, low: int, high: Optional[int] = None, what: str = '') -> int:
    """``text`` as an integer in low..high; raises ValueError in the launch scripts' words."""
    if re.fullmatch(r'[0-9]+', text) and int(text) >= low and (high is None or int(text) <= high):
        return int(text)
    if what:
        raise ValueError(f"{name} must be {what}, got '{text}'")
    raise ValueError(f"{name} must be {'a positive' if low else 'a non-negative'} integer, got '{text}'")


def _nodes(text: str, name: str) -> int:
    """A node count, where the operators' ``min:max`` form is taken only as a fixed count ``n:n``."""
    elastic = re.fullmatch(r'([0-9]+):([0-9]+)', text)
    if elastic and elastic[1] != elastic[2]:
        raise ValueError(f"{name}={text} is an elastic node range (the job's elasticPolicy minReplicas "
                         f'{elastic[1]}, maxReplicas {elastic[2]}): the launch scripts run a fixed number of '
                         'nodes; give both the same value')
    return _integer(name, elastic[1] if elastic else text, 1)


def _processes(env: Mapping[str, str], gpus: int, node_gpus: int) -> str:
    """Where the processes per node come from, after checking the operator's count agrees with GPUS."""
    asked = env.get('PET_NPROC_PER_NODE', '')
    if not asked:
        return 'GPUS'
    if asked in ('auto', 'gpu'):
        if node_gpus == 0:
            raise ValueError(f'PET_NPROC_PER_NODE={asked} starts one process per GPU, but this node has no GPU: '
                             "set the job's processes per node (nprocPerNode, numProcPerNode) to a number")
        count = node_gpus
    elif asked == 'cpu':
        if node_gpus:
            raise ValueError(f'PET_NPROC_PER_NODE=cpu asks for CPU processes, but this node has {node_gpus} '
                             "GPU(s), which the run would use: set the job's processes per node to a number")
        return 'GPUS; PET_NPROC_PER_NODE=cpu'
    else:
        count = _integer('PET_NPROC_PER_NODE', asked, 1, what="a positive integer, 'auto', 'gpu' or 'cpu'")
    if count != gpus:
        raise ValueError(f'GPUS={gpus} processes per node, but the job asks for PET_NPROC_PER_NODE={asked}'
                         + (f' ({count}, the GPUs of this node)' if asked != str(count) else '')
                         + ': give the launch script the same number')
    return f'GPUS, as PET_NPROC_PER_NODE={asked}'


def launch_layout(env: Mapping[str, str], gpus: int, node_gpus: int) -> Layout:
    """The layout of a launch of ``gpus`` processes on this node (which has ``node_gpus`` GPUs) from
    the variables in ``env``, in the order of the module's docstring; raises ValueError, one sentence
    naming the variables, when they disagree or cannot be used."""
    v1 = all(env.get(name, '') for name in V1_POD)
    sources: Dict[str, str] = {}
    text, sources['nnodes'] = _first(env, ['NNODES', 'PET_NNODES'] + (['WORLD_SIZE'] if v1 else []))
    nnodes = _nodes(text, sources['nnodes']) if text else DEFAULTS['nnodes']
    text, sources['node_rank'] = _first(env, ['NODE_RANK', 'PET_NODE_RANK'] + (['RANK'] if v1 else []))
    node_rank = _integer(sources['node_rank'], text, 0) if text else DEFAULTS['node_rank']
    master_addr, sources['master_addr'] = _first(env, ['MASTER_ADDR', 'PET_MASTER_ADDR'])
    master_addr = master_addr or DEFAULTS['master_addr']
    if not HOST.fullmatch(master_addr) or master_addr.startswith('-'):
        raise ValueError(f"{sources['master_addr']} must be a host name or an address, got '{master_addr}'")
    text, sources['port'] = _first(env, ['PORT'] + (['MASTER_PORT'] if v1 else []) + ['PET_MASTER_PORT'])
    port = _integer(sources['port'], text, 1, 65535, 'a port number (1-65535)') if text else DEFAULTS['port']
    sources['nproc_per_node'] = _processes(env, gpus, node_gpus)
    text, sources['max_restarts'] = _first(env, ['MAX_RESTARTS', 'PET_MAX_RESTARTS'])
    max_restarts = _integer(sources['max_restarts'], text, 0) if text else 0

    if node_rank >= nnodes:
        raise ValueError(f"{sources['node_rank']} must be in 0..{nnodes - 1}, got '{node_rank}'"
                         + (f" ({nnodes} node(s) from {sources['nnodes']})" if sources['nnodes'] != 'NNODES' else ''))
    if nnodes > 1 and sources['nnodes'] != 'NNODES':  # a job's nodes: each pod must know its place
        unknown = [what for what, key in (('node rank (NODE_RANK, PET_NODE_RANK)', 'node_rank'),
                                          ('master (MASTER_ADDR, PET_MASTER_ADDR)', 'master_addr'))
                   if sources[key] == 'default']
        if unknown:
            raise ValueError(f"{sources['nnodes']}={env[sources['nnodes']]} nodes, but no variable gives this "
                             f"pod's {' or '.join(unknown)}: set them")
    if v1 and sources['nnodes'] == 'PET_NNODES':  # (the user's NNODES overrides the job's counts)
        world = _integer('WORLD_SIZE', env['WORLD_SIZE'], 1)
        counts_pods = not re.fullmatch(r'[0-9]+', env.get('PET_NPROC_PER_NODE', ''))
        if world != nnodes * gpus and not (counts_pods and world == nnodes):
            raise ValueError(f"WORLD_SIZE={world} (the PyTorchJob's) is not nodes x processes per node = "
                             f"{nnodes} ({sources['nnodes']}) x {gpus} (GPUS)"
                             + (f' nor the node count {nnodes}' if counts_pods else ''))
    return Layout(nnodes, node_rank, master_addr, port, gpus, max_restarts, sources)


def master_port_taken(host: str, port: int) -> bool:
    """Whether ``port`` is already in use on ``host`` when ``host`` is this machine (a loopback or one
    of its own addresses); False for another machine's address or a name that does not resolve here,
    which this node cannot check (its rendezvous names what fails)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except socket.gaierror:
            return False
        except OSError as exc:
            return exc.errno != errno.EADDRNOTAVAIL
    return False


def main(argv: List[str]) -> int:
    """``launch_layout.py GPUS NODE_GPUS``: for the launch scripts, the layout's log line (empty unless a
    value came from a job), then its nodes, node rank, master, port and restarts, one a line; 2 after one
    ``error:`` line when the launch cannot start. Node 0 also checks that the master's port is free
    when the master is this machine."""
    try:
        layout = launch_layout(os.environ, int(argv[0]), int(argv[1]))
        if layout.node_rank == 0 and master_port_taken(layout.master_addr, layout.port):
            raise ValueError(f'port {layout.port} on {layout.master_addr} is already in use: set PORT to a free one')
    except ValueError as exc:
        print(f'error: {exc}', file=sys.stderr, flush=True)
        return 2
    print(layout.describe() if layout.from_a_job() else '', layout.nnodes, layout.node_rank, layout.master_addr,
          layout.port, layout.max_restarts, sep='\n')
    return 0
