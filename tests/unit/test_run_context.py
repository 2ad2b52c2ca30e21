"""A run's state lives in its context (``engine.distributed.run_context``), which ``process_group`` makes
and closes: a second run in the same process starts clean, and the process's signals are its own again."""
import json
import signal
import subprocess
import sys

from helpers import ROOT, env, free_ports

# two runs, one after the other, in one process (a real one-process gloo group each): each compiles,
# installs the preemption hook's handlers and arms the step watch once; what is seen inside and after
# each run is printed as JSON; then the process sends itself SIGTERM, which must end it
TWO_RUNS = '''
import json, os, signal, sys, threading, types
import torch
from torch._dynamo.callback import callback_handler
from xcit_dense.engine.distributed.process_group import begin_step_bound, end_step_bound, process_group
from xcit_dense.engine.distributed.run_context import current_context
from xcit_dense.engine.training.compile import compile_forward
from xcit_dense.engine.training.preemption_hook import PreemptionHook

SIGNALS = (signal.SIGTERM, signal.SIGINT)
before = {s: signal.getsignal(s) for s in SIGNALS}
callbacks = len(callback_handler.start_callbacks)
watches = lambda: sum(t.name == 'xcit_step_watch' for t in threading.enumerate())
kept = []  # the runs' contexts, alive until the end (their ids stay distinct)

def work():
    context = current_context()
    compile_forward(torch.nn.Linear(1, 1))
    PreemptionHook().before_train(types.SimpleNamespace(train_loop=types.SimpleNamespace(dataloader=[])))
    begin_step_bound()
    end_step_bound()
    kept.append(context)
    return dict(context=id(context), watches=watches(), callbacks=len(callback_handler.start_callbacks) - callbacks,
                handlers_replaced=[signal.getsignal(s) is not before[s] for s in SIGNALS])

seen = []
for port in sys.argv[1:]:
    os.environ['MASTER_PORT'] = port
    with process_group('pytorch'):
        inside = work()
    seen.append(dict(inside=inside, after=dict(
        watches=watches(), callbacks=len(callback_handler.start_callbacks) - callbacks,
        handlers_restored=[signal.getsignal(s) is before[s] for s in SIGNALS],
        current_is_the_runs=id(current_context()) == inside['context'])))
print(json.dumps(seen), flush=True)
os.kill(os.getpid(), signal.SIGTERM)
print('SIGTERM was swallowed', flush=True)
'''


def test_a_second_run_in_the_process_starts_clean_and_sigterm_ends_the_process_after_them():
    """Closing a run's context stops its step watch, removes its dynamo callback and puts back the
    signal handlers it replaced; the next ``process_group`` has a context of its own."""
    variables = dict(RANK=0, WORLD_SIZE=1, LOCAL_RANK=0, MASTER_ADDR='127.0.0.1')
    proc = subprocess.run([sys.executable, '-c', TWO_RUNS, *map(str, free_ports(2))], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=env(**variables))
    assert proc.returncode == -signal.SIGTERM, (proc.stdout[-2000:], proc.stderr[-2000:])
    first, second = json.loads(proc.stdout.splitlines()[0])
    for run in (first, second):
        assert run['inside']['watches'] == 1 and run['inside']['callbacks'] == 1, run
        assert run['inside']['handlers_replaced'] == [True, False], run  # SIGTERM the hook's; SIGINT untouched
        assert run['after'] == dict(watches=0, callbacks=0, handlers_restored=[True, True],
                                    current_is_the_runs=False), run
    assert first['inside']['context'] != second['inside']['context']
