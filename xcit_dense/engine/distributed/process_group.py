"""Process-group set-up and tear-down for the entry points; gloo on CPUs, NCCL on GPUs.

MMEngine 0.10.7's ``init_dist`` calls ``torch.cuda.set_device`` unconditionally and defaults to
NCCL, so it fails on a machine without GPUs. Initialising the group here first makes the Runner
skip its own initialisation.

Tear-down (see dev/exit-abort.md): a gloo group whose worker threads are still running when
the interpreter finalises can abort a finished run (SIGABRT): a worker that drops the last
reference to a finished collective must take the GIL to free the tensors' Python objects, and a
thread that asks for the GIL during finalisation is ended by ``pthread_exit``, which
``std::terminate``s inside a C++ destructor. So the group must really be destroyed, its threads
joined, before the interpreter finalises: ``process_group`` does that.
"""
import gc
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from datetime import timedelta
from functools import partial
from typing import Iterator, List, Mapping, Optional, Tuple

import torch
import torch.distributed as dist

from xcit_launch import netif

from ...errors import RankSetupError, ToolkitError
from ...tool_errors import how_it_stops
from . import collectives
from .compile_bound import COMPILE_VARIABLE
from .cuda_ops import check_cuda_ops
from .restart import agree_on_restart
from .run_context import RunContext, current_context, fresh_context
from .wait_bounds import DUMP_ALLOWANCE_S, STEP_VARIABLE, StepWatch, nccl_environment, wait_bounds

LAUNCHERS = ('none', 'pytorch', 'slurm')
_KEY = 'xcit_dense'  # prefix of this module's keys in the process group's store
_GPUS = f'{_KEY}/gpus'  # the UUIDs of the ranks' GPUs (check_distinct_gpus)


def gpus_present() -> bool:
    """True only when CUDA devices really exist (a set CUDA_VISIBLE_DEVICES is not enough)."""
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def cuda_device_index(local_rank: int, visible: int) -> int:
    """The CUDA device of a rank that shares the node's visible GPUs with the node's other ranks: its
    local rank among them. A local rank beyond the visible GPUs is an error: taking it modulo the
    count would put two ranks on one GPU (NCCL: "Duplicate GPU detected")."""
    if not 0 <= local_rank < visible:
        cvd = os.environ.get('CUDA_VISIBLE_DEVICES')
        raise RuntimeError(f'LOCAL_RANK={local_rank}, but this process sees {visible} GPU(s)'
                           f"{f' (CUDA_VISIBLE_DEVICES={cvd})' if cvd is not None else ''}: start at "
                           f'most {visible} process(es) per node (GPUS={visible})')
    return local_rank


def _gpu_count(value: str) -> Optional[int]:
    """The count of a Slurm GPU request ('2', 'a100:2'); None for none or another form."""
    count = value.rpartition(':')[2]
    return int(count) if count.isdigit() else None


def _slurm_binding(env: Mapping[str, str]) -> str:
    """The task's GPU options as srun was given them, for messages."""
    options = [f'--{option}={env[name]}' for option, name in (('gpus-per-task', 'SLURM_GPUS_PER_TASK'),
                                                              ('gpu-bind', 'SLURM_GPU_BIND')) if env.get(name)]
    return ' '.join(options) or 'no --gpus-per-task or --gpu-bind'


def slurm_device(env: Mapping[str, str], visible: int) -> Tuple[int, str]:
    """The CUDA device of a Slurm task that sees ``visible`` GPUs, and a note for the log ('' for none),
    from the task's environment ``env`` (SLURM_LOCALID, SLURM_GPUS_PER_TASK, SLURM_GPU_BIND):

    - one visible GPU: device 0 (its own, unless Slurm gave one GPU to several tasks);
    - the node's GPUs shared by its tasks (no binding; ``--gpu-bind=none``; ``--gpus-per-task`` on
      Slurm before 21.08, which did not bind): the task's local id among them (``cuda_device_index``);
    - k GPUs bound to this task alone (``--gpus-per-task=k``, ``--gpu-bind=per_task:k``, a map or mask
      of the user's): device 0, and a note that k-1 of them stay idle;
    - GPUs that other tasks see too (``--gpu-bind=closest``: those of the task's NUMA domain, as one
      task of several there cannot tell which one is its own; any other binding): RankSetupError
      naming the options that give each task one GPU of its own.

    A binding that still puts two ranks on one GPU is found once the group forms
    (``check_distinct_gpus``)."""
    if visible == 1:
        return 0, ''
    local = int(env['SLURM_LOCALID'])
    bind = env.get('SLURM_GPU_BIND', '')
    kind, _, arg = (bind[len('verbose,'):] if bind.startswith('verbose,') else bind).partition(':')
    per_task = _gpu_count(env.get('SLURM_GPUS_PER_TASK', ''))
    if kind == 'none' or (not kind and per_task != visible):
        return cuda_device_index(local, visible), ''
    own = {'': per_task, 'per_task': _gpu_count(arg), 'map_gpu': visible, 'mask_gpu': visible}.get(kind)
    if own == visible:
        return 0, (f'Slurm bound {visible} GPUs to each task ({_slurm_binding(env)}): each rank uses the first '
                   f'of its own and leaves the other {visible - 1} idle (--gpus-per-task=1 gives every GPU a rank)')
    cvd = env.get('CUDA_VISIBLE_DEVICES')
    raise RankSetupError(
        f"Slurm task {env.get('SLURM_PROCID', '?')} (local id {local}) sees {visible} GPUs"
        f"{f' (CUDA_VISIBLE_DEVICES={cvd})' if cvd else ''} that other tasks of its node see too "
        f'({_slurm_binding(env)}): which one is its own is unknown, and ranks on one GPU stop NCCL '
        f'("Duplicate GPU detected"). Give each task a GPU of its own: --gpus-per-task=1 without '
        f'--gpu-bind, or --gpu-bind=single:1 (or leave GPU binding out: each rank then takes the GPU '
        f'of its local id)')


def _rank_device(launcher: str) -> int:
    """The CUDA device of this process: by Slurm's binding under Slurm (``slurm_device``, its note
    printed by the first task), else its LOCAL_RANK among the GPUs it sees."""
    if launcher != 'slurm':
        return cuda_device_index(int(os.environ.get('LOCAL_RANK', 0)), torch.cuda.device_count())
    index, note = slurm_device(os.environ, torch.cuda.device_count())
    if note and os.environ.get('SLURM_PROCID') == '0':
        print(note, file=sys.stderr, flush=True)
    return index


def job_port(job_id: str) -> int:
    """The rendezvous port of a Slurm job without PORT: 20000-29999 by the job id (below Linux's
    ephemeral ports), so that two jobs sharing a node do not collide."""
    return 20000 + int(job_id) % 10000


def _slurm_env(context: RunContext) -> None:
    """Translate Slurm's task variables into the ones torch.distributed reads; the job's hosts noted
    in ``context``."""
    nodes = os.environ['SLURM_NODELIST']
    context.slurm_hosts = subprocess.run(['scontrol', 'show', 'hostnames', nodes], check=True,
                                         capture_output=True, text=True).stdout.split()
    master = context.slurm_hosts[0]
    os.environ.setdefault('MASTER_ADDR', master)
    os.environ.setdefault('MASTER_PORT', os.environ.get('PORT') or str(job_port(os.environ['SLURM_JOB_ID'])))
    if os.environ['SLURM_PROCID'] == '0':
        print(f"Slurm job {os.environ['SLURM_JOB_ID']} on {nodes}: master {os.environ['MASTER_ADDR']} "
              f"(the first host: {master}), port {os.environ['MASTER_PORT']}"
              f"{'' if os.environ.get('PORT') else ' (from the job id)'}", file=sys.stderr, flush=True)
    os.environ['RANK'] = os.environ['SLURM_PROCID']
    os.environ['WORLD_SIZE'] = os.environ['SLURM_NTASKS']
    os.environ['LOCAL_RANK'] = os.environ['SLURM_LOCALID']


def init_distributed(launcher: str) -> Optional[str]:
    """Join the process group for ``launcher``; returns the backend, or None for one process.

    The groups start with the long wait bound (``wait_bounds``); ``begin_step_bound`` and
    ``end_step_bound`` switch to the step bound and back. What the group's set-up learns (bounds,
    network, hosts, side group, restart count) and the step watch go to the run's context."""
    if launcher not in LAUNCHERS:
        raise ValueError(f'launcher must be one of {LAUNCHERS}, got {launcher!r}')
    if dist.is_initialized():
        return dist.get_backend()
    if launcher == 'none':
        _check_own_gpu()
        return None
    context = current_context()
    try:
        context.bounds = wait_bounds()
    except ValueError as exc:
        raise RankSetupError(str(exc)) from None
    if launcher == 'slurm':
        _slurm_env(context)
    missing = [v for v in ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT') if v not in os.environ]
    if missing:
        raise RuntimeError(f'launcher {launcher!r} needs the environment variables {missing}: start '
                           f'the run with tools/dist_train.sh (torchrun) or tools/slurm_train.sh')
    if gpus_present():
        backend = 'nccl'
        torch.cuda.set_device(_rank_device(launcher))
        _check_own_gpu()
        os.environ.update(nccl_environment(context.bounds))
    else:
        backend = 'gloo'
    timeout = timedelta(seconds=context.bounds.wait_s)
    if netif.multi_node():
        # the store first: under torchrun, node 0 may need another node's address from it
        store, rank, size = next(dist.rendezvous('env://', timeout=timeout))
        context.network = _choose_socket_interface(backend, launcher, store)
        dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=timeout)
    else:
        context.network = _one_node_network(backend)
        dist.init_process_group(backend, timeout=timeout)
    if backend == 'nccl':
        _check_own_gpu_is_distinct()
    collectives.open_control_group(context.bounds.wait_s)
    agree_on_restart()  # a collective: every rank learns whether this group is a restarted one
    _store().set(f'{_KEY}/rank{dist.get_rank()}', f'{socket.gethostname()} pid {os.getpid()}')
    if context.watch is None:
        context.watch = StepWatch(partial(_step_expired, context), partial(_compile_extension, context))
    return backend


def _check_own_gpu() -> None:
    """The ops check (``cuda_ops.check_cuda_ops``) on this process's GPU, once, after the device was
    set and before the group forms: each rank that cannot use its GPU raises RankSetupError naming
    host, rank and GPU (a peer waiting for it in the rendezvous then ends by its launcher or its bound)."""
    try:
        check_cuda_ops()
    except RuntimeError as exc:
        raise RankSetupError(str(exc)) from None


def _check_own_gpu_is_distinct() -> None:
    """``check_distinct_gpus`` for this process's GPU (its UUID, from torch), once the NCCL group has
    formed and before its first collective; the group is destroyed before the error is raised."""
    index = torch.cuda.current_device()
    cvd = os.environ.get('CUDA_VISIBLE_DEVICES')
    where = f"{socket.gethostname()} cuda:{index}{f' of CUDA_VISIBLE_DEVICES={cvd}' if cvd else ''}"
    try:
        check_distinct_gpus(_store(), dist.get_rank(), dist.get_world_size(),
                            str(torch.cuda.get_device_properties(index).uuid), where)
    except RankSetupError:
        dist.destroy_process_group()
        raise


def check_distinct_gpus(store: dist.Store, rank: int, world_size: int, gpu: str, where: str) -> None:
    """Stop a run in which two ranks drive one GPU: each rank notes the UUID of its GPU (``gpu``) in the
    group's ``store``, and once all ``world_size`` ranks have, each learns whether one was noted twice.
    Raises RankSetupError on every rank, naming two ranks on one GPU (each by ``where``, its host and
    device) and how many more share one; every rank has read it before any leaves, so the rank that
    serves the store may exit at once.

    NCCL's own error for this comes at the first collective and says only "invalid usage" (its log,
    with NCCL_DEBUG=WARN, says "Duplicate GPU detected"); a GPU's UUID tells two ranks on one GPU apart
    from two ranks on two GPUs that each sees as cuda:0."""
    mine = f'rank {rank} ({where})'
    holder = store.compare_set(f'{_GPUS}/{gpu}', '', mine).decode()
    if holder != mine:
        store.add(f'{_GPUS}/shared', 1)
        store.compare_set(f'{_GPUS}/first', '', f'{holder} and {mine} drive the same GPU (UUID {gpu})')
    _meet_in_store(store, f'{_GPUS}/noted', world_size)
    shared = store.add(f'{_GPUS}/shared', 0)
    if not shared:
        return
    first = store.get(f'{_GPUS}/first').decode()
    _meet_in_store(store, f'{_GPUS}/read', world_size)
    more = f'; {shared - 1} more rank(s) share a GPU with another rank' if shared > 1 else ''
    raise RankSetupError(f'{first}{more}. Each rank needs a GPU of its own: under Slurm --gpus-per-task=1 or '
                         f'--gpu-bind=single:1, not --gpu-bind=closest (see docs/multi-node.md)')


def _meet_in_store(store: dist.Store, name: str, world_size: int) -> None:
    """Wait until all ``world_size`` ranks have arrived at ``name`` (within the store's timeout)."""
    if store.add(f'{name}/arrived', 1) == world_size:
        store.set(f'{name}/all', '1')
    store.wait([f'{name}/all'])


def _one_node_network(backend: str) -> str:
    """One node: gloo's and NCCL's own choices work (loopback included); an explicit one is noted
    (the network's words for the plan line, '' for the defaults)."""
    names = ['GLOO_SOCKET_IFNAME'] + (['NCCL_SOCKET_IFNAME'] if backend == 'nccl' else [])
    explicit = [f'{name}={os.environ[name]}' for name in names if os.environ.get(name)]
    return f" on {', '.join(explicit)} (as set)" if explicit else ''


def _other_nodes(launcher: str, store: dist.Store) -> Optional[List[str]]:
    """Names or addresses of other nodes of this run, to find the interface that reaches them;
    None where torchrun's nodes share this machine (node 1 reaches node 0 through loopback, as in
    ``NNODES=2 MASTER_ADDR=127.0.0.1`` on one host): loopback is then the network they share.

    MASTER_ADDR first: node 0's address, seen from any other node. On node 0 itself its own name
    may resolve to a loopback address (Debian's /etc/hosts), so another node is needed: under Slurm
    the other hosts of the job's node list; under torchrun the address node 1 publishes in the
    rendezvous store (every other node's local rank 0 publishes its own)."""
    master = os.environ['MASTER_ADDR']
    if launcher == 'slurm':
        me = os.environ.get('SLURMD_NODENAME')
        return [master] + [host for host in current_context().slurm_hosts if host not in (me, master)]
    node = int(os.environ.get('GROUP_RANK', '0'))
    if node != 0:
        if os.environ.get('LOCAL_RANK', '0') == '0':
            try:
                address = netif.route_to(master).address
            except OSError:  # reported by the caller, which tries the same route
                address = ''
            store.set(f'{_KEY}/node{node}/address', address)  # '': none (node 0 must not wait in vain)
        return None if netif.is_loopback(master) else [master]
    if not netif.is_loopback(master):
        return [master]
    published = store.get(f'{_KEY}/node1/address').decode()  # waits for node 1 (the store's timeout)
    if published and netif.is_loopback(published):
        return None
    return [master] + ([published] if published else [])


def _choose_socket_interface(backend: str, launcher: str, store: dist.Store) -> str:
    """Make gloo (and NCCL) advertise an address the other nodes can reach: the one on the route
    from this node to another node of the run (``_other_nodes``).

    Left to itself, gloo advertises what the host name resolves to, often a loopback address
    (Debian's /etc/hosts), which a rank on another node cannot connect to; NCCL picks the first
    interface that is not loopback or docker, maybe not the one the nodes share. An explicit
    GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME wins. gloo is used on NCCL runs too, for the control
    collectives. Returns the network's words for the plan line; raises RuntimeError naming the
    addresses tried when no other node is reachable."""
    names = ['GLOO_SOCKET_IFNAME'] + (['NCCL_SOCKET_IFNAME'] if backend == 'nccl' else [])
    explicit = [f'{name}={os.environ[name]}' for name in names if os.environ.get(name)]
    if len(explicit) == len(names):
        return f" on {', '.join(explicit)} (as set)"
    others = _other_nodes(launcher, store)
    if others is None:  # the nodes share this machine: the libraries' defaults (loopback) serve
        return ''.join(f" on {e} (as set)" for e in explicit)
    try:
        target, route = netif.reaching_route(others)
    except OSError as exc:
        raise RuntimeError(f"this node cannot tell which network reaches the other nodes ({exc}): map "
                           f"the nodes' names to their addresses on that network, or set "
                           f"{' and '.join(names)} to its interface") from exc
    chosen = [name for name in names if not os.environ.get(name)]
    for name in chosen:
        os.environ[name] = route.interface
    target = 'MASTER_ADDR' if target == os.environ['MASTER_ADDR'] else target
    network = (f" on {route.interface} {route.address} ({', '.join(chosen)} chosen: the route to "
               f"{target} {route.master}{''.join(', ' + e + ' as set' for e in explicit)})")
    if os.environ.get('LOCAL_RANK', '0') == '0':  # each node says what it advertises
        node = os.environ.get('GROUP_RANK') or os.environ.get('SLURM_NODEID', '?')
        print(f'{socket.gethostname()} (node {node}): {backend}{network}', file=sys.stderr, flush=True)
    return network


# what gloo and NCCL say when a peer process is gone, or stopped (their errors are plain RuntimeErrors)
_PEER_GONE = ('Connection reset by peer', 'Connection closed by peer', 'Broken pipe',
              'Connection refused', 'NCCL communicator was aborted', 'remote process exited',
              'Timed out waiting')


def _store() -> dist.Store:
    return dist.distributed_c10d._get_default_store()


def is_peer_failure(exc: BaseException) -> bool:
    """True for the error a collective raises when a peer process has died or has not answered
    within the group's timeout."""
    return isinstance(exc, dist.DistError) or (
        isinstance(exc, RuntimeError) and any(text in str(exc) for text in _PEER_GONE))


def _first_sentence_of(exc: BaseException) -> str:
    """The first sentence of a backend's error, without its source-file prefix."""
    text = re.sub(r'^\[[^\]]*\]\s*', '', str(exc).strip().splitlines()[0])
    return text.split('. ')[0][:200]


def lost_peers(wait_s: float = 10.0) -> Tuple[str, List[int]]:
    """After a failed collective, name the ranks that are gone: every surviving rank reports to
    the store, and the ranks that have not reported within ``wait_s`` are named (with the host
    and process id they registered at start). Returns the text and those ranks."""
    rank, size = dist.get_rank(), dist.get_world_size()
    try:
        store = _store()
        store.set_timeout(timedelta(seconds=wait_s))  # a stopped store host must not hold this up
        store.set(f'{_KEY}/alive{rank}', '1')
        missing = _unreported(store, [r for r in range(size) if r != rank], wait_s)
        if not missing:
            return 'every rank is still alive', []
        return ', '.join(f"rank {r} ({store.get(f'{_KEY}/rank{r}').decode()})" for r in missing), missing
    except Exception as exc:  # the store lives with the master: it may be gone too
        return f'unknown: the rendezvous store is unreachable too ({type(exc).__name__}: {exc})', []


def _unreported(store: dist.Store, ranks: List[int], wait_s: float) -> List[int]:
    """Those of ``ranks`` that have not reported alive within ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while ranks and time.monotonic() < deadline:
        ranks = [r for r in ranks if not store.check([f'{_KEY}/alive{r}'])]
        time.sleep(0.2)
    return ranks


def _hosts_the_store() -> bool:
    """Whether this process serves the store: rank 0, unless torchrun's agent serves it."""
    return dist.get_rank() == 0 and os.environ.get('TORCHELASTIC_USE_AGENT_STORE') != 'True'


def gloo_worker_threads() -> List[int]:
    """Thread ids of the gloo work threads alive in this process (Linux; empty elsewhere)."""
    try:
        tids = os.listdir('/proc/self/task')
    except OSError:
        return []
    alive = []
    for tid in tids:
        try:
            with open(f'/proc/self/task/{tid}/comm') as comm:
                if comm.read().strip() == 'pt_gloo_runloop':
                    alive.append(int(tid))
        except OSError:  # the thread ended meanwhile
            pass
    return alive


def leave_process_group(sync_timeout_s: float = 60.0) -> None:
    """End a finished run: the ranks meet (within ``sync_timeout_s``), then the group is destroyed
    and its threads joined while the interpreter is alive. Raises RuntimeError when a peer does
    not arrive, or when something still holds the group after its destruction."""
    if not dist.is_initialized():
        return
    collectives.barrier_within(sync_timeout_s)  # names a missing rank, on NCCL runs too (the gloo side group)
    gc.collect()  # a finished Runner and its DDP wrapper (which holds the group) sit in cycles
    dist.destroy_process_group()  # the side group with it
    collectives.close_control_group()
    if gloo_worker_threads():
        raise RuntimeError('the process group is still referenced after destroy_process_group: its '
                           'gloo threads would run into interpreter exit (see dev/exit-abort.md)')


def _exit_now(exc: BaseException) -> None:
    """Report ``exc`` as the tools do, flush the logs and end the process at once: the toolkit's
    errors and a preemption by the tools' line and status (``tool_errors.how_it_stops``: ``error: ...``,
    1 or 3 for out of memory; a preemption silently), anything else with its traceback (status 1; 130 for
    an interrupt), as the interpreter ends on an exception nobody caught.

    An error path must not wait for peers that may be dead, and destroying the group would
    (its destructor joins threads that may be inside a collective), while leaving it to
    interpreter exit risks the abort described above. Checkpoints are written atomically, so
    nothing written is lost."""
    stop = how_it_stops(exc)
    if stop is not None:
        line, code = stop
        if line is not None:
            print(line, file=sys.stderr)
    elif isinstance(exc, KeyboardInterrupt):
        code = 130
    else:
        traceback.print_exception(exc)
        code = 1
        if dist.is_initialized() and is_peer_failure(exc):
            context = current_context()
            context.reporting.acquire()  # when the step watch reports already, it ends the process
            _report_lost_peers(context, f'a collective failed ({_first_sentence_of(exc)})')
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _report_lost_peers(context: RunContext, what: str) -> None:
    """Print the toolkit's message naming the lost ranks. A process that serves the store then
    keeps it up for the survivors that notice later (each within the step bound; the launcher
    ends this process when the first of them exits)."""
    if threading.current_thread() is threading.main_thread():  # (only it may; in training the
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # preemption hook's handler defers SIGTERM anyway)
    gone, missing = lost_peers()
    print(f'error: rank {dist.get_rank()} lost its peers: {what}; gone: {gone}. The checkpoints '
          f'already written are complete: continue with --resume.', file=sys.stderr, flush=True)
    if missing and _hosts_the_store():
        _unreported(_store(), missing, context.bounds.step_s)


def _step_expired(context: RunContext) -> None:
    """The step watch's report (of ``context``'s run): a training step outlived its bound (a peer stopped, or gone from
    the network, without closing its connections). On NCCL runs NCCL's own timeout follows
    ``DUMP_ALLOWANCE_S`` after the step's whole bound (a compile's share included where none was
    granted), writes the flight-recorder dump and ends the process; this thread ends it after that
    in any case."""
    if not context.reporting.acquire(blocking=False):
        return  # the main thread is reporting a failed collective and ends the process
    bounds = context.bounds
    granted = context.watch is not None and context.watch.granted_s > 0
    compiled = f' + {COMPILE_VARIABLE}={bounds.compile_s} s (a rank compiled in it)' if granted else ''
    _report_lost_peers(context, f'a training step has not finished within {STEP_VARIABLE}={bounds.step_s} s{compiled}')
    if dist.is_initialized() and not collectives.serves_cpu(dist.get_backend()):
        time.sleep((0 if granted else _compile_allowance_s(context)) + DUMP_ALLOWANCE_S + 30)
    logging.shutdown()
    os._exit(1)


_GLOO_FIRST_S = 10  # on gloo the watch waits this much past the groups' timeout: gloo's error names the peer


def _compile_allowance_s(context: RunContext) -> int:
    """What a compile may add to a step's bound: the compile bound where this run compiles, else 0."""
    return context.bounds.compile_s if context.compiles.enabled() else 0


def _compile_extension(context: RunContext) -> float:
    """The step watch's extension of a step that outlived the step bound: the compile bound where a
    rank compiled in the step (``compile_bound``), none otherwise."""
    granted = context.compiles.extension_s(context.bounds.compile_s)
    return granted + (_GLOO_FIRST_S if granted and collectives.serves_cpu(dist.get_backend()) else 0)


def begin_step_bound() -> None:
    """From now on a collective waits at most the step bound (every rank calls it as a step begins).

    In a run that compiles, a collective issued now keeps the time a compile may add (it cannot be
    extended once issued), and the step watch holds the step bound unless a rank compiles."""
    context = current_context()
    context.compiles.step_began()
    allowance = _compile_allowance_s(context)
    collectives.set_timeouts(context.bounds.step_s + allowance, DUMP_ALLOWANCE_S)
    if context.watch is not None:
        gloo_first = collectives.serves_cpu(dist.get_backend()) and not allowance
        context.watch.arm(context.bounds.step_s + (_GLOO_FIRST_S if gloo_first else 0))


def end_step_bound() -> None:
    """Back to the long bound (evaluation, checkpoint writes and the like follow a step)."""
    context = current_context()
    context.compiles.step_ended()
    if context.watch is not None:
        context.watch.disarm()
    collectives.set_timeouts(context.bounds.wait_s)


def wait_bound_s() -> int:
    """The long bound of this run: for waits outside a training step."""
    return current_context().bounds.wait_s


@contextmanager
def process_group(launcher: str) -> Iterator[Optional[str]]:
    """Join the process group for the run inside the block, yielding the backend (None for one
    process), and leave it properly at the end; the run's state lives in a fresh context
    (``run_context``), closed as the block ends (the step watch stopped, the dynamo callback removed,
    the signal handlers the run replaced restored).

    Run the work inside the block in a function, so that its Runner (whose DDP wrapper holds the
    group) is garbage when the block ends. A block that ends normally leaves through
    ``leave_process_group``; one that raises ends the process at once (``_exit_now``: the tools'
    message and status), waiting for no peer. With one process (no group) the block's exceptions
    pass on to the caller."""
    with fresh_context():
        backend = init_distributed(launcher)
        if backend is None:
            yield None
            return
        try:
            yield backend
        except BaseException as exc:  # noqa: B902  (every failure ends the same way)
            _exit_now(exc)
        try:
            leave_process_group()
        except Exception as exc:  # a peer lost at the very end, or the group still held
            _exit_now(ToolkitError(f'the run finished, but leaving the process group failed: {exc}'))


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def describe_topology(backend: Optional[str]) -> str:
    """'N nodes, M processes, backend B' for the run plan line."""
    if not dist.is_initialized():
        return '1 node, 1 process, no process group'
    processes = dist.get_world_size()
    per_node = int(os.environ.get('LOCAL_WORLD_SIZE') or os.environ.get('SLURM_NTASKS_PER_NODE', '0')
                   .split('(')[0] or processes)
    nodes = int(os.environ.get('SLURM_JOB_NUM_NODES') or max(1, processes // max(per_node, 1)))
    return f'{nodes} node(s), {processes} processes, backend {backend}{current_context().network}'
