"""Every rank's figures of one logger interval, and what the log says about them.

Each rank measures its own (``RankFigures``): its peak memory over the interval, the share of the
interval it spent waiting for batches, its own step time (``step_clock``) and its host. The ranks
gather them once per interval (``hooks.rank_figures``); ``RanksSummary`` names the rank with the
most memory, the one that waited longest for data and the slowest one beside the median of the
others, as a log line, scalars and warnings.

Memory: on GPUs the peak bytes allocated and reserved by torch's caching allocator on the rank's
device (MMEngine's logger resets the peak when it logs, so the figure covers one interval); on CPUs
the process's resident peak (``VmHWM``), reset after each reading where the kernel allows it. Data
workers are processes of their own: their memory is not counted.
"""
import os
import resource
import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

from .node_sampler import NodeUse

DATA_WAIT_WARN = 0.20  # share of an interval spent waiting for batches
SLOW_RANK_WARN = 0.15  # own step time above the median of the other ranks'
COMM_WAIT_WARN = 0.30  # share of the iterations spent waiting in gradient communication
GPU_IDLE_WARN = 70.0  # mean GPU utilisation (%) below which a GPU is called underused
_MB = 2 ** 20


@dataclass
class RankFigures:
    """One rank's figures over one logger interval."""

    rank: int
    host: str
    memory_mb: float  # peak (CUDA: allocated; CPU: resident)
    reserved_mb: Optional[float]  # CUDA: peak reserved by the caching allocator; None on CPUs
    data_wait: Optional[float]  # share of the interval inside the loop's batch fetch; None: not timed
    own_step_s: Optional[float]  # mean own step time; None when no step was timed (no DDP, first step)
    interval_s: float
    comm_wait: Optional[float] = None  # share of the iterations after the own step time (see the hook)
    node: Optional[NodeUse] = None  # the network and GPU sampler's figures
    tflops: Optional[float] = None  # achieved training TFLOP/s (model_flops); None: not counted
    mfu: Optional[float] = None  # tflops over the device's peak; None: peak unknown


def resident_peak_mb() -> float:
    """This process's peak resident memory (MB): ``VmHWM`` of /proc/self/status, else getrusage's
    peak (which cannot be reset)."""
    try:
        with open('/proc/self/status') as status:
            for line in status:
                if line.startswith('VmHWM:'):
                    return int(line.split()[1]) * 1024 / _MB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / _MB  # kB on Linux


def reset_resident_peak() -> bool:
    """Start a new resident peak from the current use (Linux: '5' to /proc/self/clear_refs)."""
    try:
        with open(f'/proc/{os.getpid()}/clear_refs', 'w') as clear:
            clear.write('5')
        return True
    except OSError:
        return False


def peak_memory_mb(device: torch.device) -> Tuple[float, Optional[float]]:
    """(peak, reserved peak or None) of this rank since the peak was last reset, in MB."""
    if device.type == 'cuda':
        return (torch.cuda.max_memory_allocated(device) / _MB, torch.cuda.max_memory_reserved(device) / _MB)
    return resident_peak_mb(), None


def rate_text(tflops: float) -> str:
    """TFLOP/s as text: in GFLOP/s below one TFLOP/s."""
    return f'{tflops:.2f} TFLOP/s' if tflops >= 1 else f'{tflops * 1e3:.3g} GFLOP/s'


def _who(figures: RankFigures) -> str:
    return f'rank {figures.rank}, {figures.host}'


@dataclass
class RanksSummary:
    """What the gathered figures of one interval say (see the module)."""

    figures: List[RankFigures]

    @property
    def most_memory(self) -> RankFigures:
        return max(self.figures, key=lambda f: (f.memory_mb, -f.rank))

    @property
    def most_data_wait(self) -> Optional[RankFigures]:
        """The rank that waited longest for batches (None: no rank's loop timed its fetches)."""
        timed = [f for f in self.figures if f.data_wait is not None]
        return max(timed, key=lambda f: (f.data_wait, -f.rank)) if timed else None

    def slowest(self) -> Optional[Tuple[RankFigures, float]]:
        """The rank with the longest own step time and the median of the others' (None: fewer than
        two ranks timed a step)."""
        timed = [f for f in self.figures if f.own_step_s is not None]
        if len(timed) < 2:
            return None
        slow = max(timed, key=lambda f: (f.own_step_s, -f.rank))
        return slow, statistics.median(f.own_step_s for f in timed if f is not slow)

    def line(self) -> str:
        """The log line of the interval."""
        memory, data = self.most_memory, self.most_data_wait
        reserved = f', {memory.reserved_mb:.0f} MB reserved' if memory.reserved_mb is not None else ''
        kind = 'allocated' if memory.reserved_mb is not None else 'resident'
        parts = [f'{len(self.figures)} rank(s): peak memory max {memory.memory_mb:.0f} MB {kind}{reserved} '
                 f'({_who(memory)})',
                 f'data wait max {data.data_wait:.1%} ({_who(data)})' if data is not None
                 else 'data wait n/a (the train loop does not time its fetches)']
        slowest = self.slowest()
        if slowest is not None:
            slow, median = slowest
            parts.append(f'own step time slowest {slow.own_step_s * 1e3:.1f} ms ({_who(slow)}), '
                         f'median of the others {median * 1e3:.1f} ms')
        comm = self.most_comm_wait()
        if comm is not None:
            parts.append(f'communication wait max {comm.comm_wait:.1%} ({_who(comm)})')
        parts.extend(self._node_parts())
        counted = [f for f in self.figures if f.tflops is not None]
        if counted:
            mean = statistics.fmean(f.tflops for f in counted)
            utilised = [f.mfu for f in counted if f.mfu is not None]
            mfu = f', MFU {statistics.fmean(utilised):.1%}' if utilised else ''
            parts.append(f'achieved {rate_text(mean)} per rank{mfu}')
        return '; '.join(parts)

    def most_comm_wait(self) -> Optional[RankFigures]:
        waited = [f for f in self.figures if f.comm_wait is not None]
        return max(waited, key=lambda f: (f.comm_wait, -f.rank)) if waited else None

    def per_node(self) -> Dict[str, NodeUse]:
        """Each host's network figures (from its first rank that read them)."""
        nodes: Dict[str, NodeUse] = {}
        for f in self.figures:
            if f.node is not None and f.node.received_mb_s is not None:
                nodes.setdefault(f.host, f.node)
        return nodes

    def _gpus(self) -> List[RankFigures]:
        return [f for f in self.figures if f.node is not None and f.node.gpu_memory_mb is not None]

    def _node_parts(self) -> List[str]:
        parts = []
        nodes = self.per_node()
        if nodes:
            busiest = sorted(nodes.items(), key=lambda item: item[1].received_mb_s + item[1].sent_mb_s)
            shown = busiest if len(busiest) <= 2 else [busiest[0], busiest[-1]]
            parts.append('network ' + ', '.join(
                f'{host} {use.interface} {use.received_mb_s:.1f} MB/s in, {use.sent_mb_s:.1f} MB/s out'
                for host, use in shown) + ('' if len(busiest) <= 2 else f' (least and most of {len(busiest)} nodes)'))
        gpus = self._gpus()
        if gpus:
            used = max(gpus, key=lambda f: (f.node.gpu_memory_mb, -f.rank))
            timed = [f for f in gpus if f.node.gpu_utilisation is not None]
            if timed:
                idle = min(timed, key=lambda f: (f.node.gpu_utilisation, f.rank))
                utilisation = f'GPU utilisation min {idle.node.gpu_utilisation:.0f}% ({_who(idle)})'
            else:
                utilisation = 'GPU utilisation n/a (MIG)'
            parts.append(f'{utilisation}, GPU memory max {used.node.gpu_memory_mb:.0f} of '
                         f'{used.node.gpu_memory_total_mb:.0f} MB ({_who(used)})')
        return parts

    def scalars(self) -> Dict[str, float]:
        """The interval's figures for curves (``ranks/`` names; per rank and the extremes)."""
        out: Dict[str, float] = {
            'ranks/memory_max_mb': self.most_memory.memory_mb, 'ranks/memory_max_rank': self.most_memory.rank}
        data = self.most_data_wait
        if data is not None:
            out['ranks/data_wait_max'], out['ranks/data_wait_max_rank'] = data.data_wait, data.rank
        for f in self.figures:
            out[f'ranks/memory_mb/rank{f.rank}'] = f.memory_mb
            if f.data_wait is not None:
                out[f'ranks/data_wait/rank{f.rank}'] = f.data_wait
            if f.own_step_s is not None:
                out[f'ranks/own_step_s/rank{f.rank}'] = f.own_step_s
        slowest = self.slowest()
        if slowest is not None:
            out['ranks/own_step_max_s'] = slowest[0].own_step_s
            out['ranks/own_step_max_rank'] = slowest[0].rank
            out['ranks/own_step_others_median_s'] = slowest[1]
        for f in self.figures:
            if f.comm_wait is not None:
                out[f'ranks/comm_wait/rank{f.rank}'] = f.comm_wait
            if f.node is not None and f.node.gpu_utilisation is not None:
                out[f'ranks/gpu_utilisation/rank{f.rank}'] = f.node.gpu_utilisation
            if f.node is not None and f.node.gpu_memory_mb is not None:
                out[f'ranks/gpu_memory_mb/rank{f.rank}'] = f.node.gpu_memory_mb
        counted = [f for f in self.figures if f.tflops is not None]
        if counted:
            out['ranks/tflops_mean'] = statistics.fmean(f.tflops for f in counted)
            utilised = [f.mfu for f in counted if f.mfu is not None]
            if utilised:
                out['ranks/mfu_mean'] = statistics.fmean(utilised)
        for host, use in self.per_node().items():
            out[f'ranks/net_received_mb_s/{host}'] = use.received_mb_s
            out[f'ranks/net_sent_mb_s/{host}'] = use.sent_mb_s
        return out

    def warnings(self, num_workers: int) -> Dict[str, str]:
        """{kind: message} of the thresholds passed in this interval."""
        found = {}
        data = self.most_data_wait
        if data is not None and data.data_wait > DATA_WAIT_WARN:
            found['data_wait'] = (
                f'{_who(data)} waited for batches {data.data_wait:.0%} of the interval (over '
                f'{DATA_WAIT_WARN:.0%}): the data pipeline does not keep up; more loading processes '
                f'(train_dataloader.num_workers, now {num_workers}) or a lighter pipeline may help')
        slowest = self.slowest()
        if slowest is not None and slowest[1] > 0 and slowest[0].own_step_s > (1 + SLOW_RANK_WARN) * slowest[1]:
            slow, median = slowest
            found['slow_rank'] = (
                f'{_who(slow)} is slow: its own step time {slow.own_step_s * 1e3:.1f} ms is '
                f'{slow.own_step_s / median - 1:.0%} above the median of the other ranks ({median * 1e3:.1f} ms, '
                f'over {SLOW_RANK_WARN:.0%}); every rank waits for it in the gradient all-reduce')
        comm = self.most_comm_wait()
        if comm is not None and comm.comm_wait > COMM_WAIT_WARN:
            use = self.per_node().get(comm.host)
            rate = (f'; {use.interface} of {comm.host} carried {use.received_mb_s:.1f} MB/s in and '
                    f'{use.sent_mb_s:.1f} MB/s out' if use is not None else '')
            found['comm_wait'] = (
                f'{_who(comm)} waited in gradient communication {comm.comm_wait:.0%} of its iterations (over '
                f'{COMM_WAIT_WARN:.0%}): it waits for a slower rank, or the network between the ranks is the limit'
                f'{rate}')
        timed = [f for f in self._gpus() if f.node.gpu_utilisation is not None]
        if timed:
            idle = min(timed, key=lambda f: (f.node.gpu_utilisation, f.rank))
            if idle.node.gpu_utilisation < GPU_IDLE_WARN:
                found['gpu_idle'] = (f'the GPU of {_who(idle)} was {idle.node.gpu_utilisation:.0f}% utilised '
                                     f'over the interval (under {GPU_IDLE_WARN:.0f}%): the step does not keep it busy')
        return found
