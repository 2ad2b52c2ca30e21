"""Network and GPU use, sampled about once a second by a background thread, never in the step.

- The network: bytes received and sent per second on the interface the process group uses, from
  the kernel's counters (``/proc/net/dev``); per node (every rank of a node reads the same
  counters). The interface is the one ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` name (the
  toolkit sets them on multi-node runs, ``engine.distributed.process_group``), else the one on the route to
  ``MASTER_ADDR``. Traffic NCCL sends over InfiniBand or NVLink does not pass these counters.
- The rank's GPU from NVML (``nvidia-ml-py``): utilisation and memory in use. The device is found
  by the UUID torch reports for the rank's CUDA device, so that ``CUDA_VISIBLE_DEVICES`` (indices
  or UUIDs, in any order) maps to the right one. NVML reports no utilisation for a MIG slice: the
  figures then hold its memory only. Without NVML or a GPU there are no GPU figures, silently.
"""
import os
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

from xcit_launch import netif

NET_DEV = '/proc/net/dev'
_MB = 2 ** 20


def read_net_dev(interface: str, path: str = NET_DEV) -> Optional[Tuple[int, int]]:
    """(bytes received, bytes sent) of ``interface`` from a ``/proc/net/dev`` table (None: not listed)."""
    try:
        with open(path) as table:
            lines = table.readlines()[2:]  # two header lines
    except OSError:
        return None
    for line in lines:
        name, _, counters = line.partition(':')
        if name.strip() == interface:
            fields = counters.split()
            return int(fields[0]), int(fields[8])
    return None


def group_interface(backend: Optional[str], env=os.environ) -> Optional[str]:
    """The interface the process group's traffic uses (see the module); None when unknown."""
    names = ['NCCL_SOCKET_IFNAME', 'GLOO_SOCKET_IFNAME'] if backend == 'nccl' else ['GLOO_SOCKET_IFNAME']
    for name in names:
        value = env.get(name, '')
        if value and not value.startswith('^'):  # (a '^' list names interfaces not to use)
            return value.lstrip('=').split(',')[0]
    master = env.get('MASTER_ADDR')
    if not master:
        return None
    try:
        return netif.route_to(master).interface
    except OSError:
        return None


class GpuReader:
    """One GPU's utilisation and memory through NVML's functions (``nvml``: the ``pynvml`` module)."""

    def __init__(self, nvml: Any, handle: Any, mig: bool) -> None:
        self._nvml, self._handle, self.mig = nvml, handle, mig

    def read(self) -> Tuple[Optional[float], float, float]:
        """(utilisation in % or None on a MIG slice, memory used MB, memory total MB)."""
        utilisation = None
        if not self.mig:
            utilisation = float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)
        memory = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        return utilisation, memory.used / _MB, memory.total / _MB


def gpu_by_uuid(nvml: Any, uuid: str) -> GpuReader:
    """The NVML device whose UUID is ``uuid`` as torch reports it (without NVML's ``GPU-`` or
    ``MIG-`` prefix). Raises NVML's error when no device has it."""
    error = None
    for name in (uuid, f'GPU-{uuid}', f'MIG-{uuid}'):
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(name)
        except nvml.NVMLError as exc:
            error = exc
            continue
        try:
            mig = bool(nvml.nvmlDeviceIsMigDeviceHandle(handle))
        except nvml.NVMLError:  # (drivers before MIG)
            mig = False
        return GpuReader(nvml, handle, mig)
    raise error


def open_rank_gpu() -> Optional[GpuReader]:
    """The NVML reader of this rank's CUDA device; None without CUDA devices or NVML (no error)."""
    import torch
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return None
    try:
        import pynvml
        pynvml.nvmlInit()
        return gpu_by_uuid(pynvml, str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid))
    except Exception:  # no NVML library, no driver access, an unknown device: no GPU figures
        return None


@dataclass
class NodeUse:
    """What the sampler saw since it was last asked."""

    interface: Optional[str]
    received_mb_s: Optional[float]  # None: fewer than two readings of the interface
    sent_mb_s: Optional[float]
    gpu_utilisation: Optional[float]  # mean %, None on a MIG slice or without a GPU reader
    gpu_memory_mb: Optional[float]  # the most in use (NVML: the whole device, other processes too)
    gpu_memory_total_mb: Optional[float]
    mig: bool


class NodeSampler:
    """Reads the network counters and the GPU every ``period_s`` in a daemon thread (``start``,
    ``stop``); ``take`` gives what it saw since the last ``take``. ``sample`` takes one reading
    (the thread's work; callable directly)."""

    def __init__(self, interface: Optional[str], gpu: Optional[GpuReader], period_s: float = 1.0,
                 net_dev: str = NET_DEV) -> None:
        self.interface, self.gpu, self.period_s, self.net_dev = interface, gpu, period_s, net_dev
        self._lock = threading.Lock()
        self._first: Optional[Tuple[float, int, int]] = None  # (time, received, sent)
        self._last: Optional[Tuple[float, int, int]] = None
        self._utilisation: List[float] = []
        self._memory: List[float] = []
        self._total: Optional[float] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def sample(self, now: Optional[float] = None) -> None:
        now = time.monotonic() if now is None else now
        counters = read_net_dev(self.interface, self.net_dev) if self.interface else None
        gpu = None
        if self.gpu is not None:
            try:
                gpu = self.gpu.read()
            except Exception:  # a GPU gone from NVML's view: no figure rather than a failed run
                gpu = None
        with self._lock:
            if counters is not None:
                self._last = (now, *counters)
                self._first = self._first or self._last
            if gpu is not None:
                if gpu[0] is not None:
                    self._utilisation.append(gpu[0])
                self._memory.append(gpu[1])
                self._total = gpu[2]

    def take(self) -> NodeUse:
        with self._lock:
            received = sent = None
            if self._first is not None and self._last[0] > self._first[0]:
                span = self._last[0] - self._first[0]
                received = (self._last[1] - self._first[1]) / span / _MB
                sent = (self._last[2] - self._first[2]) / span / _MB
            use = NodeUse(self.interface, received, sent,
                          statistics.fmean(self._utilisation) if self._utilisation else None,
                          max(self._memory) if self._memory else None, self._total,
                          bool(self.gpu and self.gpu.mig))
            self._first = self._last
            self._utilisation, self._memory = [], []
        return use

    def start(self) -> 'NodeSampler':
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name='xcit_node_sampler', daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        self.sample()
        while not self._stop.wait(self.period_s):
            self.sample()
