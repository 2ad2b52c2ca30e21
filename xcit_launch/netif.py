"""Which local address and interface reach the master: what a rank should advertise to its peers.

Standard library only: the torchrun wrapper (``xcit_launch.torchrun``) and the ranks' process
group set-up (``xcit_dense.engine.dist``) both use it.

gloo, unless GLOO_SOCKET_IFNAME names an interface, advertises the address the host name resolves
to; on many hosts (Debian's /etc/hosts maps the host name to 127.0.0.1 or 127.0.1.1) that is a
loopback address, which a rank on another machine cannot reach. The address to advertise is the
one this machine uses to reach the master (``MASTER_ADDR``): its peers reach the master too, so
they are on that network. ``route_to`` finds it by the kernel's own route choice (a UDP socket
"connected" to the master sends nothing, but gets the source address of that route), then the
interface that holds the address.
"""
import fcntl
import ipaddress
import os
import socket
import struct
from typing import NamedTuple, Optional

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


def gloo_interface(env=os.environ) -> Optional[Route]:
    """The route gloo should advertise, or None where gloo's default is right or was chosen.

    None when GLOO_SOCKET_IFNAME is set (an explicit choice wins), when MASTER_ADDR is unset or
    loopback (all ranks on this machine). Raises OSError when MASTER_ADDR is unreachable."""
    master = env.get('MASTER_ADDR')
    if env.get('GLOO_SOCKET_IFNAME') or not master or is_loopback(master):
        return None
    return route_to(master)
