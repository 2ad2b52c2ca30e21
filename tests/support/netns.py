"""Test hosts made of Linux network namespaces: own interfaces and addresses on a private subnet.

``private_hosts(n)`` creates n namespaces, each a "host" with an interface eth0 at 10.213.S.(i+1)/24
(S random, not a subnet this machine already uses; another prefix on request: gloo's side of a
pair with the larger address is the one that connects, so hosts whose addresses must sort above
127.0.1.1, as 172.16/12 and 192.168/16 do, use 198.18, the range reserved for network tests).
Two hosts are joined by one veth pair; more are joined through a bridge in an extra "switch"
namespace. Every interface is created inside the
test's namespaces, so the host's own interfaces, routes and /etc are never touched. On exit (also
on failure) the processes still inside the namespaces are killed by pid and the namespaces
deleted.

A command runs on a host through ``nsenter --net``; with ``hosts_file=True`` it also gets a mount
namespace of its own in which a temporary hosts file (host names node0, node1, ...; the machine's
host name on a loopback address, as Debian writes it) is bind-mounted over /etc/hosts: only that
process tree sees it. With ``own_name_loopback=True`` each host gets a file of its own in which its
own name maps to 127.0.1.1 too (as a Debian install writes it) and only the others' names to their
subnet addresses. The file system is otherwise shared, as on a cluster with a shared one.
"""
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Sequence

PREFIX = '10.213'
NETNS_DIR = '/run/netns'  # where `ip netns add` puts its namespaces


def missing_reason() -> str:
    """Why network namespaces cannot be created here, or '' when they can."""
    if os.geteuid() != 0:
        return 'network namespaces need root'
    absent = [tool for tool in ('ip', 'nsenter', 'unshare', 'mount') if not shutil.which(tool)]
    if absent:
        return f'{", ".join(absent)} not found (iproute2, util-linux)'
    return ''


def _ip(*args: str) -> str:
    return subprocess.run(['ip', *args], check=True, capture_output=True, text=True, timeout=30).stdout


def _subnets_in_use(prefix: str) -> set:
    """The prefix.S subnets already on this machine's interfaces (read only)."""
    used = set()
    for line in _ip('-o', '-4', 'addr').splitlines():
        address = line.split()[3]
        if address.startswith(prefix + '.'):
            used.add(int(address.split('.')[2]))
    return used


@dataclass
class Host:
    ns: str  # the namespace
    name: str  # its host name in the hosts file (node0, ...)
    address: str  # its address on the test subnet
    interface: str = 'eth0'


class Network:
    """The hosts of one private_hosts() block."""

    def __init__(self, hosts: List[Host], namespaces: List[str], root: Path,
                 own_name_loopback: bool = False) -> None:
        self.hosts, self.namespaces, self.root = hosts, namespaces, root
        self.hosts_files = {}
        for me in hosts:
            own = [me.name] if own_name_loopback else []
            lines = ['127.0.0.1 localhost', ' '.join(['127.0.1.1', socket.gethostname(), *own])]
            lines += [f'{h.address} {h.name}' for h in hosts if h.name not in own]
            self.hosts_files[me.name] = root / f'hosts-{me.name}'
            self.hosts_files[me.name].write_text('\n'.join(lines) + '\n')

    def command(self, host: Host, args: Sequence[str], hosts_file: bool = False) -> List[str]:
        """``args`` run on ``host`` (its network namespace; with ``hosts_file``, its hosts file)."""
        # nsenter, not `ip netns exec`: that one remounts /sys, hiding /sys/fs/cgroup (slurmd needs it)
        cmd = ['nsenter', f'--net={NETNS_DIR}/{host.ns}']
        if hosts_file:
            cmd += ['unshare', '--mount', '--propagation', 'private', 'sh', '-c',
                    f'mount --bind {self.hosts_files[host.name]} /etc/hosts && exec "$@"', 'sh']
        return cmd + [str(a) for a in args]

    def power_off(self, host: Host) -> None:
        """Take ``host`` down as a power cut does: its cable first (no FIN or RST reaches a peer, which
        waits as it would for a vanished machine), then every process on it, killed."""
        _ip('-n', host.ns, 'link', 'set', host.interface, 'down')
        _kill_all([host.ns])

    def host_pids(self, host: Host) -> List[int]:
        """Processes on ``host`` (inside its network namespace)."""
        return [int(p) for p in _ip('netns', 'pids', host.ns).split()]

    def pids(self) -> List[int]:
        """Processes inside this network's namespaces."""
        found = []
        for ns in self.namespaces:
            try:
                found += [int(p) for p in _ip('netns', 'pids', ns).split()]
            except subprocess.CalledProcessError:
                pass
        return found


def _kill_all(namespaces: List[str]) -> None:
    """SIGKILL every process inside the namespaces (by pid; again for any a dying one started)."""
    for _ in range(3):
        pids = []
        for ns in namespaces:
            result = subprocess.run(['ip', 'netns', 'pids', ns], capture_output=True, text=True)
            pids += [int(p) for p in result.stdout.split()]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.5)


def _close(namespaces: List[str], root: Path) -> None:
    """Kill the processes left in the namespaces, delete the namespaces and the directory."""
    _kill_all(namespaces)
    for ns in namespaces:
        subprocess.run(['ip', 'netns', 'del', ns], capture_output=True)
    shutil.rmtree(root, ignore_errors=True)


@contextmanager
def private_hosts(count: int = 2, own_name_loopback: bool = False, prefix: str = PREFIX) -> Iterator[Network]:
    """``count`` hosts on a private subnet of ``prefix`` (see the module's docstring); removed on exit."""
    used = _subnets_in_use(prefix)
    subnet = random.choice([s for s in range(1, 255) if s not in used])
    tag = f'xcit{os.getpid() % 100000}{random.randrange(1000):03d}'
    hosts = [Host(f'{tag}h{i}', f'node{i}', f'{prefix}.{subnet}.{i + 1}') for i in range(count)]
    namespaces = [h.ns for h in hosts] + ([f'{tag}sw'] if count > 2 else [])
    root = Path(tempfile.mkdtemp(prefix='xcit-netns-'))
    root.chmod(0o755)
    created: List[str] = []
    try:
        for ns in namespaces:
            _ip('netns', 'add', ns)
            created.append(ns)
            _ip('-n', ns, 'link', 'set', 'lo', 'up')
        if count == 2:  # one cable
            a, b = hosts
            _ip('-n', a.ns, 'link', 'add', a.interface, 'type', 'veth', 'peer', 'name', b.interface,
                'netns', b.ns)
        elif count > 2:  # a switch
            switch = namespaces[-1]
            _ip('-n', switch, 'link', 'add', 'br0', 'type', 'bridge')
            _ip('-n', switch, 'link', 'set', 'br0', 'up')
            for i, h in enumerate(hosts):
                _ip('-n', switch, 'link', 'add', f'port{i}', 'type', 'veth', 'peer', 'name', h.interface,
                    'netns', h.ns)
                _ip('-n', switch, 'link', 'set', f'port{i}', 'master', 'br0', 'up')
        for h in hosts:
            if count > 1:
                _ip('-n', h.ns, 'addr', 'add', f'{h.address}/24', 'dev', h.interface)
                _ip('-n', h.ns, 'link', 'set', h.interface, 'up')
        yield Network(hosts, namespaces, root, own_name_loopback)
    finally:
        _close(created, root)


def namespaces_left(network: Network) -> List[str]:
    """The namespaces of ``network`` that still exist (none once its block has ended)."""
    out = subprocess.run(['ip', 'netns', 'list'], capture_output=True, text=True).stdout
    existing = {line.split()[0] for line in out.splitlines() if line.strip()}
    return [ns for ns in network.namespaces if ns in existing]
