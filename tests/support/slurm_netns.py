"""A private multi-node Slurm cluster on test hosts made of network namespaces (tests/support/netns.py).

Host node0 runs slurmctld (under this machine's host name, which Slurm requires of a controller,
at node0's address) and is the login node (srun, sbatch, scontrol run there); node1, node2,
... each run a slurmd with its own address (NodeAddr), all joined by a bridge. Each daemon has the
test's hosts file over /etc/hosts in a mount namespace of its own, and so have the tasks it
starts. One munged (a Unix socket in the temporary directory, reachable from every namespace)
authenticates them all. Everything else is as in slurm_cluster.PrivateSlurmCluster: a private
configuration (SLURM_CONF) in a temporary directory; the daemons use Slurm's default ports, which
inside the namespaces collide with nothing of this machine.
"""
import os
import subprocess
import time
from typing import Dict, List

import netns
import slurm_cluster

SLURM_CONF = """ClusterName=xcitnet
SlurmctldHost={hostname}({ctl.address})
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge.socket,cred_expire={cred_expire}
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
PlugStackConfig={root}/plugstack.conf
SwitchType=switch/none
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SlurmdTimeout={slurmd_timeout}
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
{nodes}
PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""
NODE = 'NodeName={h.name} NodeAddr={h.address} CPUs={cpus} RealMemory=8000 Gres=gpu:2 State=UNKNOWN'
GRES_CONF = 'NodeName={names} Name=gpu File=/dev/null\nNodeName={names} Name=gpu File=/dev/zero\n'


class NamespacedSlurmCluster(slurm_cluster.PrivateSlurmCluster):
    """slurmctld on ``net.hosts[0]``, one slurmd on each other host of ``net``."""

    def __init__(self, net: netns.Network, slurmd_timeout: int = 300, cred_expire: int = 120) -> None:
        super().__init__()
        self.net = net
        self.ctl, self.nodes = net.hosts[0], net.hosts[1:]
        self.slurmd_timeout = slurmd_timeout
        self.cred_expire = cred_expire  # also how long a requeued job waits before it may start again

    def command(self, host: netns.Host, *args: str) -> List[str]:
        return self.net.command(host, args, hosts_file=True)

    def run(self, *args: str, check: bool = False) -> subprocess.CompletedProcess:
        """A Slurm command on the login node (node0), against this cluster."""
        return subprocess.run(self.command(self.ctl, *args), env=self.env, capture_output=True, text=True,
                              check=check, timeout=60)

    def start(self, timeout: float = 90) -> None:
        (self.root / 'munge.key').write_bytes(os.urandom(1024))
        (self.root / 'munge.key').chmod(0o400)
        (self.root / 'state').mkdir()
        for h in self.nodes:
            (self.root / f'spool-{h.name}').mkdir()
        (self.root / 'plugstack.conf').write_text('')
        names = ','.join(h.name for h in self.nodes)
        self.conf.write_text(SLURM_CONF.format(
            ctl=self.ctl, hostname=self.host, root=self.root, slurmd_timeout=self.slurmd_timeout,
            cred_expire=self.cred_expire, names=names,
            nodes='\n'.join(NODE.format(h=h, cpus=os.cpu_count()) for h in self.nodes)))
        (self.root / 'gres.conf').write_text(GRES_CONF.format(names=names))
        munge = [f'--socket={self.root}/munge.socket', f'--key-file={self.root}/munge.key',
                 f'--pid-file={self.pid_file("munged")}', f'--log-file={self.root}/munged.log',
                 f'--seed-file={self.root}/munged.seed']
        subprocess.run(['munged', *munge], check=True, timeout=30)
        self.run('slurmctld', '-f', str(self.conf), check=True)
        for h in self.nodes:
            self.start_slurmd(h)
        deadline = time.time() + timeout
        states: Dict[str, str] = {}
        while time.time() < deadline:
            states = self.node_states()
            if states and all(s in ('idle', 'mixed', 'allocated') for s in states.values()):
                return
            for name, state in states.items():
                if 'drain' in state or 'down' in state or 'inval' in state:
                    self.run('scontrol', 'update', f'nodename={name}', 'state=resume')
            time.sleep(1)
        raise RuntimeError(f'the private Slurm nodes did not become idle (sinfo: {states}); logs: {self.logs()}')

    def start_slurmd(self, host: netns.Host) -> None:
        subprocess.run(self.command(host, 'slurmd', '-f', str(self.conf), '-N', host.name), env=self.env,
                       check=True, capture_output=True, timeout=60)

    def node_states(self) -> Dict[str, str]:
        out = self.run('sinfo', '-h', '-N', '-o', '%N %T').stdout
        return dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)

    def logs(self) -> str:
        tails = []
        for path in sorted(self.root.glob('*.log')):
            tails.append(f'--- {path.name}\n' + '\n'.join(path.read_text().splitlines()[-15:]))
        return '\n'.join(tails)

    def daemons(self) -> List[str]:
        """Its daemons by pid-file stem, in stop order: the slurmds first."""
        return [f'slurmd-{h.name}' for h in self.nodes] + ['slurmctld', 'munged']
