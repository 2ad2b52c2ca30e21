"""A real one-host Slurm cluster (munge, slurmctld, slurmd) for the launcher tests.

Two fake GPUs are declared as generic resources so that the scripts' --gres=gpu:N requests
work on a machine without GPUs. Needs root and Debian's slurm-wlm and munge packages
(tools/run_tests.sh installs them where it can).
"""
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

SLURM_CONF = """ClusterName=xcit
SlurmctldHost={host}
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SwitchType=switch/none
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName={host} CPUs={cpus} RealMemory=8000 Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""
GRES_CONF = """NodeName={host} Name=gpu File=/dev/null
NodeName={host} Name=gpu File=/dev/zero
"""


def missing_reason() -> str:
    """Why a cluster cannot be started here, or '' when it can."""
    if os.geteuid() != 0:
        return 'the Slurm tests need root (to run munged, slurmctld and slurmd)'
    absent = [b for b in ('munged', 'slurmctld', 'slurmd', 'srun', 'sbatch') if not shutil.which(b)]
    if absent:
        return (f'Slurm is not installed ({", ".join(absent)} missing); '
                f'apt-get install slurm-wlm munge (tools/run_tests.sh does this as root)')
    return ''


def _running(name: str) -> bool:
    return subprocess.run(['pgrep', '-x', name], capture_output=True).returncode == 0


def _start_munge() -> None:
    key = Path('/etc/munge/munge.key')
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        key.write_bytes(os.urandom(1024))
    for path in (key.parent, Path('/var/run/munge'), Path('/var/log/munge'), Path('/var/lib/munge')):
        path.mkdir(parents=True, exist_ok=True)
        shutil.chown(path, 'munge', 'munge')
    shutil.chown(key, 'munge', 'munge')
    key.chmod(0o400)
    if not _running('munged'):
        subprocess.run(['runuser', '-u', 'munge', '--', '/usr/sbin/munged'], check=True)


def _write_if_changed(path: Path, text: str) -> bool:
    if path.exists() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return True


def start_cluster(timeout: float = 60) -> str:
    """Start (or reuse) the cluster; returns the node name once it accepts jobs."""
    host = socket.gethostname().split('.')[0]
    _start_munge()
    changed = _write_if_changed(Path('/etc/slurm/slurm.conf'),
                                SLURM_CONF.format(host=host, cpus=os.cpu_count()))
    changed |= _write_if_changed(Path('/etc/slurm/gres.conf'), GRES_CONF.format(host=host))
    for path in ('/var/spool/slurmctld', '/var/spool/slurmd', '/var/log/slurm'):
        os.makedirs(path, exist_ok=True)
    if changed and _running('slurmctld'):
        subprocess.run(['scontrol', 'shutdown'], capture_output=True)
        time.sleep(2)
    if not _running('slurmctld'):
        subprocess.run(['slurmctld'], check=True)
    if not _running('slurmd'):
        subprocess.run(['slurmd'], check=True)
    deadline = time.time() + timeout
    while time.time() < deadline:
        state = subprocess.run(['sinfo', '-h', '-n', host, '-o', '%T'], capture_output=True,
                               text=True).stdout.strip()
        if state in ('idle', 'mixed', 'allocated'):
            return host
        if 'drain' in state or 'down' in state or 'inval' in state:
            subprocess.run(['scontrol', 'update', f'nodename={host}', 'state=resume'],
                           capture_output=True)
        time.sleep(1)
    raise RuntimeError(f'the Slurm node {host} did not become idle (sinfo: {state!r}); '
                       f'see /var/log/slurm/')
