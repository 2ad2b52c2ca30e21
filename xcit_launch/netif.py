"""Which local address and interface reach the other nodes: what a rank should advertise to its peers.

Standard library only: the torchrun wrapper (``xcit_launch.torchrun``) and the ranks' process
group set-up (``xcit_dense.engine.distributed.process_group``) both use it.

gloo, unless GLOO_SOCKET_IFNAME names an interface, advertises the address the host name resolves
to; on many hosts (Debian's /etc/hosts maps the host name to 127.0.0.1 or 127.0.1.1) that is a
loopback address, which a rank on another machine cannot reach. The address to advertise is the
one this machine uses to reach another node of the run (``reaching_route``): the master
(``MASTER_ADDR``) from any other node; from node 0 itself, whose own name may resolve to a loopback
address there, another node. Whether a run spans several nodes at all comes from the launcher's
own counts (``node_count``), not from where a name resolves. ``route_to`` finds the address by
the kernel's own route choice (a UDP socket "connected" to the other node sends nothing, but gets
the source address of that route), then the interface that holds it.
"""
import fcntl
import ipaddress
import os
import socket
import struct
from typing import NamedTuple, Optional, Sequence, Tuple

SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address


class Route(NamedTuple):
    master: str  # the master's address (MASTER_ADDR resolved)
    address: str  # the local address on the route to it
    interface: str  # the interface that holds ``address``


def resolve(host: str) -> str:
    """The address ``host`` names (IPv4 preferred); raises OSError when it does not resolve."""
    infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    return infos[0][4][0]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine's loopback (False if it does not resolve)."""
    if host == 'localhost':
        return True
    try:
        return ipaddress.ip_address(resolve(host)).is_loopback
    except (OSError, ValueError):
        return False


def _ipv4_of(name: str) -> Optional[str]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack('256s', name[:15].encode()))
        except OSError:  # no IPv4 address
            return None
    return socket.inet_ntoa(packed[20:24])


def _ipv6_holders(address: str) -> list:
    """Interfaces holding the IPv6 ``address`` (from /proc/net/if_inet6)."""
    want = ipaddress.ip_address(address).exploded.replace(':', '')
    try:
        with open('/proc/net/if_inet6') as f:
            return [line.split()[5] for line in f if line.split()[0] == want]
    except OSError:
        return []


def interface_of(address: str) -> Optional[str]:
    """The name of the local interface that holds ``address`` (None if none does)."""
    if ipaddress.ip_address(address).version == 6:
        holders = _ipv6_holders(address)
        return holders[0] if holders else None
    for _, name in socket.if_nameindex():
        if _ipv4_of(name) == address:
            return name
    return None


def route_to(master: str, port: int = 9) -> Route:
    """The local address and interface on the route to ``master`` (a host name or an address).

    Raises OSError when ``master`` does not resolve or no route leads to it."""
    address = resolve(master)
    family = socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((address, port))  # a UDP connect sends nothing: it only picks the route
        local = s.getsockname()[0]
    name = interface_of(local)
    if name is None:
        raise OSError(f'no local interface holds {local}, the source address of the route to {master}')
    return Route(address, local, name)


def node_count(env=os.environ) -> Optional[int]:
    """How many nodes the launcher started this run on, from its own variables (None: unknown).

    Slurm: the step's node count (``SLURM_STEP_NUM_NODES``, else ``SLURM_NNODES``); torchrun:
    ``WORLD_SIZE`` over ``LOCAL_WORLD_SIZE`` (its processes per node). Never from where a name
    resolves: a node's own name may resolve to a loopback address on a multi-node cluster."""
    slurm = env.get('SLURM_STEP_NUM_NODES') or env.get('SLURM_NNODES')
    if slurm:
        return int(slurm)
    world, local = env.get('WORLD_SIZE'), env.get('LOCAL_WORLD_SIZE')
    if world and local:
        return -(-int(world) // int(local))
    return None


def multi_node(env=os.environ) -> bool:
    """Whether the launcher started this run on more than one node (see ``node_count``)."""
    return (node_count(env) or 1) > 1


def reaching_route(targets: Sequence[str]) -> Tuple[str, Route]:
    """The first of ``targets`` (host names or addresses of other nodes) that resolves to an address
    of another machine, and the route to it from here: the interface the other nodes can reach.

    Raises OSError naming every target and what became of it when none does (each resolves to a
    loopback address here, or does not resolve, or has no route)."""
    tried = []
    for target in targets:
        try:
            route = route_to(target)
        except OSError as exc:
            tried.append(f'{target}: {exc}')
            continue
        if ipaddress.ip_address(route.address).is_loopback:
            tried.append(f'{target} resolves to {route.master} on this node (a loopback address)')
            continue
        return target, route
    raise OSError('no other node reachable: ' + ('; '.join(tried) or 'no address of another node known'))
