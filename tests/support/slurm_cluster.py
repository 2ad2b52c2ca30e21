"""A private one-host Slurm cluster (munged, slurmctld, slurmd) for the launcher tests.

Everything lives under one temporary directory: slurm.conf and gres.conf (pointed to by
SLURM_CONF), state, spool, logs, pid files and a munged with its own socket and key; the
daemons listen on free, non-default ports. Nothing is written to /etc/slurm or /etc/munge and a
cluster already running on this host (default ports, system munged) is left alone. Two fake
GPUs are declared as generic resources so that --gres=gpu:N works on a machine without GPUs.
Needs root and Debian's slurm-wlm and munge packages (tools/run_tests.sh installs them as root).
"""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, List

from helpers import free_ports

SLURM_CONF = """ClusterName=xcittest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge.socket
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
PlugStackConfig={root}/plugstack.conf
SwitchType=switch/none
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=8000 Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""
GRES_CONF = """NodeName={host} Name=gpu File=/dev/null
NodeName={host} Name=gpu File=/dev/zero
"""
DEFAULT_PORTS = (6817, 6818)
DAEMONS = ('slurmd', 'slurmctld', 'munged')  # stop order


def missing_reason() -> str:
    """Why a cluster cannot be started here, or '' when it can."""
    if os.geteuid() != 0:
        return 'the Slurm tests need root (to run munged, slurmctld and slurmd)'
    needed = ('munged', 'munge', 'slurmctld', 'slurmd', 'srun', 'sbatch', 'scontrol', 'scancel', 'sinfo',
              'squeue')
    absent = [b for b in needed if not shutil.which(b)]
    if absent:
        return (f'Slurm is not installed ({", ".join(absent)} missing); '
                f'apt-get install slurm-wlm munge (tools/run_tests.sh does this as root)')
    return ''


def _alive(pid: int) -> bool:
    """Whether pid is a live (not zombie) process."""
    try:
        return Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[0] != 'Z'
    except (FileNotFoundError, IndexError):
        return False


def _cmdline(pid: int) -> str:
    """The command line of pid, words joined by spaces ('' when it has gone)."""
    try:
        return Path(f'/proc/{pid}/cmdline').read_bytes().replace(b'\0', b' ').decode(errors='replace')
    except (FileNotFoundError, ProcessLookupError):
        return ''


class PrivateSlurmCluster:
    """munged, slurmctld and slurmd of a cluster of one node, all under a temporary directory."""

    def __init__(self) -> None:
        """Choose the directory, node name and ports; starts nothing."""
        self.root = Path(tempfile.mkdtemp(prefix='xcit-slurm-'))
        self.root.chmod(0o755)  # munged requires its socket's directory to be searchable by all
        self.host = socket.gethostname().split('.')[0]
        self.ctld_port, self.slurmd_port = free_ports(2, exclude=DEFAULT_PORTS)
        self.conf = self.root / 'slurm.conf'
        self.env: Dict[str, str] = dict(os.environ, SLURM_CONF=str(self.conf))

    def pid_file(self, daemon: str) -> Path:
        """Where the daemon writes its pid."""
        return self.root / f'{daemon}.pid'

    def run(self, *args: str, check: bool = False) -> subprocess.CompletedProcess:
        """Run a Slurm command against this cluster (SLURM_CONF set), capturing its output."""
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True, check=check,
                              timeout=60)

    def start(self, timeout: float = 60) -> None:
        """Write the configuration, start the daemons and wait until the node accepts jobs."""
        (self.root / 'munge.key').write_bytes(os.urandom(1024))
        (self.root / 'munge.key').chmod(0o400)
        for sub in ('state', 'spool'):
            (self.root / sub).mkdir()
        (self.root / 'plugstack.conf').write_text('')
        self.conf.write_text(SLURM_CONF.format(host=self.host, cpus=os.cpu_count(), root=self.root,
                                               ctld_port=self.ctld_port, slurmd_port=self.slurmd_port))
        (self.root / 'gres.conf').write_text(GRES_CONF.format(host=self.host))
        munge = [f'--socket={self.root}/munge.socket', f'--key-file={self.root}/munge.key',
                 f'--pid-file={self.pid_file("munged")}', f'--log-file={self.root}/munged.log',
                 f'--seed-file={self.root}/munged.seed']
        subprocess.run(['munged', *munge], check=True, timeout=30)
        self.run('slurmctld', '-f', str(self.conf), check=True)
        self.run('slurmd', '-f', str(self.conf), check=True)
        deadline = time.time() + timeout
        state = ''
        while time.time() < deadline:
            state = self.run('sinfo', '-h', '-n', self.host, '-o', '%T').stdout.strip()
            if state in ('idle', 'mixed', 'allocated'):
                return
            if 'drain' in state or 'down' in state or 'inval' in state:
                self.run('scontrol', 'update', f'nodename={self.host}', 'state=resume')
            time.sleep(1)
        raise RuntimeError(f'the private Slurm node {self.host} did not become idle (sinfo: {state!r}); '
                           f'logs: {self.logs()}')

    def logs(self) -> str:
        """The tails of the daemons' logs, for error messages."""
        tails = []
        for name in ('slurmctld.log', 'slurmd.log', 'munged.log'):
            path = self.root / name
            if path.exists():
                tails.append(f'--- {name}\n' + '\n'.join(path.read_text().splitlines()[-20:]))
        return '\n'.join(tails)

    def jobs(self) -> List[str]:
        """Ids of the jobs this cluster still knows as pending or running."""
        return self.run('squeue', '-h', '-o', '%A').stdout.split()

    def cancel_jobs(self, timeout: float = 60) -> List[str]:
        """scancel every job of this cluster (they are all the tests'); returns those cancelled."""
        jobs = self.jobs()
        if jobs:
            self.run('scancel', *jobs)
            deadline = time.time() + timeout
            while self.jobs() and time.time() < deadline:
                time.sleep(1)
        return jobs

    def daemons(self) -> List[str]:
        """The names of this cluster's daemons (their pid files' stems), in stop order."""
        return list(DAEMONS)

    def daemon_pids(self) -> Dict[str, int]:
        """The live daemons of this cluster by name (read from their pid files and checked)."""
        pids = {}
        for daemon in self.daemons():
            try:
                pid = int(self.pid_file(daemon).read_text().split()[0])
            except (FileNotFoundError, IndexError, ValueError):
                continue
            mark = str(self.root / 'munge.socket') if daemon == 'munged' else str(self.conf)
            if _alive(pid) and mark in _cmdline(pid):  # never signal a reused pid
                pids[daemon] = pid
        return pids

    def leftovers(self) -> List[str]:
        """Live processes whose command line names this cluster's directory ('pid command')."""
        found = []
        for entry in Path('/proc').iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid() and _alive(int(entry.name)):
                line = _cmdline(int(entry.name))
                if str(self.root) in line:
                    found.append(f'{entry.name} {line.strip()}')
        return found

    def stop(self, timeout: float = 30) -> List[str]:
        """Stop this cluster's daemons in order (TERM, then KILL), remove its directory; returns leftovers."""
        for daemon, pid in self.daemon_pids().items():
            os.kill(pid, signal.SIGTERM)
            deadline = time.time() + timeout
            while _alive(pid) and time.time() < deadline:
                time.sleep(0.2)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
                time.sleep(1)
        left = self.leftovers()
        if not left:
            shutil.rmtree(self.root, ignore_errors=True)
        return left


@contextmanager
def running(cluster: PrivateSlurmCluster) -> Iterator[PrivateSlurmCluster]:
    """``cluster`` started; afterwards (also when a test fails) its jobs are scancelled and its daemons
    stopped, and the block fails if any of its processes outlived it."""
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.cancel_jobs()
        leftovers = cluster.stop()
    assert not leftovers, f'processes of the private cluster outlived it: {leftovers}'
