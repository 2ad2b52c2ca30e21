"""Checkpoints, downloads and checkpoint writes as an attacker would use them: a file that runs code
through the allow-list, memory bombs, a poisoned or unpinned download cache, a planted link."""
import hashlib
import json
import multiprocessing
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Dict

import numpy as np
import pytest
import torch
from checkpoint_attacks import (
    ARCHIVE_ATTACKS,
    PLANTED_VALUES,
    Reduce,
    key_of,
    planted,
    released,
    torch_records,
    with_config_texts,
    zip_bytes,
    zip_of,
)
from helpers import SUPPORT, GetattrExploit, find_resumable_checkpoint, free_port, hide_payload, resumable
from mmengine.logging import HistoryBuffer, MessageHub
from mmengine.registry import DefaultScope
from mmengine.runner.checkpoint import CheckpointLoader, _load_checkpoint, save_checkpoint

from xcit_dense.engine.training import resume
from xcit_dense.engine.training.rng_state_hook import get_rng_state
from xcit_dense.io import download
from xcit_dense.io.checked_unpickler import history_buffer_method
from xcit_dense.io.checkpoint import AtomicLocalBackend, CheckpointError, read_without_data
from xcit_dense.io.checkpoint_schemes import install_checked_schemes
from xcit_dense.io.download import ALLOW_HTTP, cache_path
from xcit_dense.io.weights import read_checkpoint


@pytest.fixture(autouse=True)
def checked_schemes(monkeypatch) -> None:
    """MMEngine's schemes routed to the checked reader, as the toolkit's tools and configs install
    them (importing xcit_dense does not); restored after each test."""
    monkeypatch.setattr(CheckpointLoader, '_schemes', dict(CheckpointLoader._schemes))
    install_checked_schemes()


@pytest.fixture
def evil(tmp_path) -> Path:
    path = tmp_path / 'evil.pth'
    torch.save({'state_dict': {}, 'meta': GetattrExploit(str(tmp_path / 'pwned'))}, path)
    return path


def test_the_getattr_chain_runs_nothing_through_any_reader(evil):
    """The checked reader refuses it; torch's own weights-only load (what any other reader in the process
    uses) refuses it too, its allow-list untouched by the toolkit; the reader's ``getattr`` resolves
    HistoryBuffer's methods only."""
    with pytest.raises(CheckpointError, match=r'evil\.pth: refused.*could run code'):
        read_checkpoint(str(evil))
    with pytest.raises(CheckpointError, match='could run code'):
        _load_checkpoint(str(evil))  # MMEngine's reader: load_from, resume, the stock inferencers
    with pytest.raises(pickle.UnpicklingError, match=r'GLOBAL (builtins\.)?getattr was not an allowed global'):
        torch.load(evil, weights_only=True)
    assert not (evil.parent / 'pwned').exists()
    assert history_buffer_method(HistoryBuffer, 'mean') is HistoryBuffer.mean
    for obj, name in ((HistoryBuffer, '__init__'), (HistoryBuffer, '__class__'), (os, 'system')):
        with pytest.raises(pickle.UnpicklingError):
            history_buffer_method(obj, name)


def test_a_toolkit_checkpoint_with_logs_numpy_and_rng_states_still_loads(tmp_path):
    hub = MessageHub('security-test')
    for step in range(3):
        hub.update_scalar('train/loss', np.float64(1.0 / (step + 1)))
    hub.update_info('iter', np.int64(3))
    saved = dict(state_dict={'w': torch.arange(6.0)}, message_hub=hub.state_dict(),
                 meta=dict(seed=np.int64(12345), rng_states=[get_rng_state()], mean=np.float32(0.5),
                           array=np.arange(4, dtype=np.int16), empty=np.zeros(0, dtype=np.float32)))
    save_checkpoint(saved, str(tmp_path / 'iter_3.pth'))
    loaded = read_checkpoint(str(tmp_path / 'iter_3.pth'))
    scalars = loaded['message_hub']['log_scalars']['train/loss']
    assert scalars.mean() == pytest.approx(np.mean([1.0, 0.5, 1 / 3]))
    assert scalars.statistics('min') == pytest.approx(1 / 3)
    assert loaded['meta']['rng_states'][0]['numpy'][1].tolist() == saved['meta']['rng_states'][0]['numpy'][1].tolist()
    np.testing.assert_array_equal(loaded['meta']['rng_states'][0]['torch'], saved['meta']['rng_states'][0]['torch'])
    assert loaded['meta']['array'].dtype == np.int16 and loaded['meta']['seed'] == 12345
    assert loaded['meta']['empty'].shape == (0,)  # its data pickled as bytes(), refused by the old list


def _tensor_args():
    return (torch.zeros(2).storage(), 0, (2,), (1,), False, OrderedDict())


# values built from names that are allowed, used as no real checkpoint uses them (a list of names and a
# scan of the opcodes let the state of a tensor through: torch's legacy set_(), a view charged nothing)
CRAFTED = {
    'a call of a value': (lambda: Reduce(Reduce(getattr, (HistoryBuffer, 'mean')), (HistoryBuffer([1.0], [1]),)),
                          'a call of function'),
    'the state of a tensor': (lambda: Reduce(torch._utils._rebuild_tensor_v2, _tensor_args(),
                                              state=(torch.zeros(4).storage(), 0, (2,), (2,))),
                              'setting the state of a Tensor'),
    'an item set into a tensor': (lambda: Reduce(torch._utils._rebuild_tensor_v2, _tensor_args(), items=[(0, 1.0)]),
                                  'into a Tensor is refused'),
    'an object dtype': (lambda: Reduce(np.dtype, ('O8', False, True)), "numpy.dtype('O8') is refused"),
}


@pytest.mark.parametrize('case', CRAFTED)
def test_allowed_names_used_otherwise_are_refused_as_they_are_built(tmp_path, case):
    """Checks on what is built: only listed constructors are called, only listed types get a state,
    items go into dicts and lists only, dtypes are numeric."""
    make, reason = CRAFTED[case]
    torch.save({'meta': make()}, tmp_path / 'crafted.pth')
    with pytest.raises(CheckpointError, match=re.escape(reason)):
        read_checkpoint(str(tmp_path / 'crafted.pth'))


def test_the_reader_is_used_under_torch_force_weights_only_load(tmp_path, monkeypatch):
    """torch.load refuses any pickle module under TORCH_FORCE_WEIGHTS_ONLY_LOAD=1; the toolkit's reader
    does not go through torch.load, so the variable changes nothing for it."""
    save_checkpoint({'state_dict': {'w': torch.ones(2)}, 'meta': {'seed': np.int64(3)}}, str(tmp_path / 'c.pth'))
    monkeypatch.setenv('TORCH_FORCE_WEIGHTS_ONLY_LOAD', '1')
    with pytest.raises(RuntimeError, match='explicit pickle_module'):
        torch.load(tmp_path / 'c.pth', pickle_module=pickle, weights_only=False)
    assert read_checkpoint(str(tmp_path / 'c.pth'))['meta']['seed'] == 3


def test_a_real_checkpoint_with_a_hidden_payload_is_refused(tmp_path):
    """The payload in the meta of an otherwise valid MMEngine checkpoint."""
    real = tmp_path / 'real.pth'
    save_checkpoint({'state_dict': {'w': torch.ones(3)}, 'meta': {'iter': 2}}, str(real))
    hidden = hide_payload(real, tmp_path / 'pwned', tmp_path / 'hidden.pth')
    with pytest.raises(CheckpointError, match=r'hidden\.pth: refused'):
        read_checkpoint(str(hidden))
    assert not (tmp_path / 'pwned').exists()


@pytest.mark.parametrize('place', ['runtime_info cfg', 'meta cfg'])
@pytest.mark.parametrize('inferencer', ['mmseg', 'mmdet'])
def test_a_stock_inferencer_given_weights_alone_never_runs_their_config_text(tmp_path, place, inferencer):
    """Issue 63: MMEngine's inferencers given weights and no config ran the text in the message hub's
    runtime_info['cfg'] (else meta['cfg']) as Python; read checked, the file comes without it, and the
    inferencer stops with MMEngine's own message (pass the config)."""
    from mmdet.apis import DetInferencer
    from mmseg.apis import MMSegInferencer
    marker = tmp_path / 'pwned'
    torch.save(with_config_texts({'state_dict': {'w': torch.ones(2)}, 'meta': {'iter': 2}}, marker, (place,)),
               tmp_path / 'weights.pth')
    build = {'mmseg': MMSegInferencer, 'mmdet': DetInferencer}[inferencer]
    with DefaultScope.overwrite_default_scope(inferencer), \
            pytest.raises(ValueError, match='Cannot find the config in the checkpoint'):
        build(model=None, weights=str(tmp_path / 'weights.pth'), device='cpu')
    assert not marker.exists()


# what each of issue 63's archives (tests/support/checkpoint_attacks.py) is refused for; before, the check read
# them with Python's zipfile and each loaded, torch reading what the check had not seen
ARCHIVE_REASONS = {'deflated record': "'small/data.pkl' is compressed (method 8)",
                   'archive comment': '12 bytes after the end record or an archive comment',
                   'names equal but for case': "two records named 'small/data/0' and 'small/DATA/0'",
                   'local header naming another record': "local header of the record 'small/data/0' does not agree",
                   'overlapping records': "'small/data/0' starts at offset 570, not where the record before it ends",
                   'a second central directory': 'not directly before the end record',
                   'a name torch lists cut short': "torch's reader lists 8 records"}


@pytest.mark.parametrize('case', ARCHIVE_REASONS)
def test_an_archive_torch_would_read_otherwise_is_refused(tmp_path, case):
    """Issue 63: the archive is parsed once, strictly, as torch's reader finds it, before torch opens it,
    then torch's own list of records is compared with the parse. The same records written plainly load."""
    records = torch_records(tmp_path)
    (tmp_path / 'plain.pth').write_bytes(zip_bytes([(name, data, {}) for name, data in records]))
    assert torch.equal(read_checkpoint(str(tmp_path / 'plain.pth'))['state_dict']['w'], torch.ones(2))
    (tmp_path / 'attack.pth').write_bytes(ARCHIVE_ATTACKS[case](records))
    with pytest.raises(CheckpointError, match=r'attack\.pth: refused') as error:
        read_checkpoint(str(tmp_path / 'attack.pth'))
    assert ARCHIVE_REASONS[case] in str(error.value), error.value


def test_every_mmengine_scheme_goes_to_the_checked_reader_or_is_refused():
    """No prefix is left to one of MMEngine's own readers (which unpickle with weights_only=False):
    object stores go through their file backend to the checked reader, pavi:// is refused."""
    from xcit_dense.io import checkpoint_schemes
    loaders = {prefix: loader.__module__ for prefix, loader in CheckpointLoader._schemes.items()}
    assert {'', 'https://', 'torchvision://', 'open-mmlab://', 'openmmlab://', 'modelzoo://', 'mmcls://',
            'pavi://', r'(\S+\:)?s3://', r'(\S+\:)?petrel://'} <= set(loaders)
    assert set(loaders.values()) == {'xcit_dense.io.checkpoint_schemes'}, loaders
    assert CheckpointLoader._schemes['pavi://'] is checkpoint_schemes.refuse
    assert CheckpointLoader._schemes[r'(\S+\:)?s3://'] is checkpoint_schemes.load_from_remote_store


def test_checkpoint_attacks_in_one_capped_process(tmp_path):
    """Issue 31's attacks, each as a user's run meets it (tests/support/checkpoint_attacks.py), in one
    process whose address space is capped after the imports; each case notes what it catches."""
    env = dict(os.environ, TORCH_HOME=str(tmp_path / 'torch_home'))
    proc = subprocess.run([sys.executable, str(SUPPORT / 'checkpoint_attacks.py'), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    outcomes = {k: v for line in proc.stdout.splitlines() if line.startswith('{') for k, v in json.loads(line).items()}
    assert proc.returncode == 0, (proc.returncode, outcomes, proc.stderr[-3000:])  # -11: the object array crashed it
    # model-zoo names read a planted hub-cache file with MMEngine's own reader (weights_only=False): code ran
    assert not (tmp_path / 'pwned').exists(), outcomes
    for name in ('torchvision://resnet50', 'modelzoo://resnet50', 'open-mmlab://resnet50_v1c',
                 'openmmlab://resnet50_v1c', 'mmcls://resnet50', 'ResNet init_cfg torchvision://resnet50'):
        assert outcomes[name].startswith('refused') and 'could run code' in outcomes[name], (name, outcomes[name])
    assert outcomes['ResNet init_cfg torchvision://resnet18 (placed by hand)'] == 'loaded True', outcomes
    # MMEngine: bare torch.load; here pavi:// is refused, object stores go through their file backend (petrel_client,
    # absent here) to the checked reader (tests/unit/test_checked_loading.py reads one through a stand-in)
    assert outcomes['pavi://model'].startswith('refused') and 'not read from this scheme' in outcomes['pavi://model']
    for name in ('s3://bucket/model.pth', 'petrel://bucket/model.pth'):
        assert 'petrel_client' in outcomes[name], outcomes[name]
    # numpy.ndarray callable directly, in the reader's list and in torch's process-wide one: exit 139 on use
    assert outcomes['object array'].startswith('refused') and 'a call of type' in outcomes['object array'], outcomes
    assert outcomes['object array, torch weights_only'].startswith('UnpicklingError'), outcomes
    # zipfile.is_zipfile (finds the appended zip) and the first data.pkl record: the check read another pickle
    # than torch, which then allocated the declared 64 GiB (MemoryError under the cap)
    assert outcomes['legacy with a zip appended'].startswith('refused') and \
        'bytearray of int 68719476736' in outcomes['legacy with a zip appended'], outcomes
    assert outcomes['two data.pkl'].startswith('refused') and 'holds 2 data.pkl records' in outcomes['two data.pkl']
    # declared sizes: a bytearray of 64 GiB, a record declaring 64 GiB (a few KB each)
    assert outcomes['bytearray of 64 GiB'].startswith('refused') and 'bytearray of int 68719476736' \
        in outcomes['bytearray of 64 GiB'], outcomes
    assert outcomes['record of 64 GiB'].startswith('refused') and 'runs into the central directory or past the ' \
        'end of the file' in outcomes['record of 64 GiB'], outcomes['record of 64 GiB']
    # issue 63: the end record points torch's reader at a central directory whose data.pkl inflates to 256 MiB
    # (a 260 KB file), zipfile at the one directly before it, as torch.save wrote it; before, the check read
    # zipfile's and torch then inflated the other (+512 MB)
    bomb, growth = outcomes['deflate bomb behind a second directory'].rsplit(' | peak +', 1)
    assert bomb.startswith('refused') and 'not directly before the end record' in bomb and int(growth[:-3]) < 8, \
        outcomes['deflate bomb behind a second directory']
    # sizes a scan of names and literals did not see or sum: an integer inside a numpy scalar (a bytearray takes
    # bytes only), copies of one stored value (5 GiB from 580 KB: a limit per call, or none for copies, is not one
    # for the file), a tensor view (zero strides: 2**36 elements once cast)
    assert outcomes['size in a numpy scalar'].startswith('refused') and 'bytearray of int64' \
        in outcomes['size in a numpy scalar'], outcomes
    assert outcomes['many calls'].startswith('refused') and 'a bytearray (262144 bytes) brings what it would ' \
        'allocate (data)' in outcomes['many calls'], outcomes['many calls']
    assert outcomes['zero strides, cast'].startswith('refused') and 'strides (0, 0) (549755813888 bytes) brings' \
        in outcomes['zero strides, cast'], outcomes
    # the reader's own memory: 1 MB of one-opcode lists, about 70 MB of objects if unpickled whole (or listed by a
    # scan), refused once the opcodes have cost 64 times the file
    opcodes, growth = outcomes['many opcodes'].rsplit(' | peak +', 1)
    assert opcodes.startswith('refused') and 'one more pickle opcode' in opcodes and int(growth[:-3]) < 48, outcomes
    # issue 47, through the checked reader: what is built, the work on it, the messages, tar parsing
    check_shape_attacks(outcomes, 'reader')
    # torch's allow-list: the same before `import xcit_dense` (after torch._dynamo's), after it and after the reads
    before, after_import, after_reads = outcomes['safe globals']
    assert before == after_import == after_reads, (set(after_import) ^ set(before), set(after_reads) ^ set(before))


# what each of issue 47's attacks is refused for (tests/support/checkpoint_attacks.py): a crash (SIGSEGV: a deep
# key's hash), unbounded CPU time (a key's hash over 2**28 shared values, colliding keys, products of huge sizes,
# tarfile's pax parsing), a message of unbounded cost (a repr, a huge int formatted), a cycle, a _metadata that
# load_state_dict fails on, a key nothing writes
SHAPE_REASONS = {'deep tuple key': 'nested more than 64 deep', 'doubling tuple key': 'values once unrolled',
                 'repr of a call': 'values once unrolled', 'long global name': '(2000003 long) is not allowed',
                 'huge int in a message': 'bytearray of int an int of 399999 bits',
                 'colliding int keys': 'below 2**48', 'cycle': 'already inside another value',
                 'legacy tar with a pax header': 'legacy tar format', 'huge sizes in a view': 'an int of 2041 bits',
                 '_metadata a list': "_metadata that is a list", 'meta with a float key': 'that is 1.5'}
META_REASONS = {'iter a string': "iter is '7'", 'iter NaN': 'iter is nan', 'iter inf': 'iter is inf',
                'iter of 5,000 digits': '(5000 long)', 'epoch 2**60': 'epoch is 1152921504606846976',
                'data_position without epoch': 'not a dict of epoch and samples'}


def check_shape_attacks(outcomes: dict, path_kind: str) -> None:
    """Each attack refused, naming its file and reason, in a message under 1,000 characters and within 2 s of
    CPU time; the process ran them all (no signal)."""
    reasons = dict(SHAPE_REASONS, **(META_REASONS if path_kind == 'read_meta' else {}))
    assert set(reasons) <= set(outcomes), (path_kind, sorted(set(reasons) - set(outcomes)), outcomes)
    for case, reason in reasons.items():
        message, cpu = outcomes[case]
        assert message.startswith('refused') and reason in message and '.pth' in message, (path_kind, case, message)
        assert len(message) < 1000 and cpu < 2, (path_kind, case, len(message), cpu)


@pytest.mark.slow
def test_checkpoint_attacks_through_read_meta_and_mmengine(tmp_path):
    """Issue 47's attacks through the two other reading paths, one process each (run side by side): the
    meta a resume's choice reads (with the damaged metas) and MMEngine's load_checkpoint (load_from)."""
    procs = {}
    for kind in ('read_meta', 'mmengine'):
        (tmp_path / kind).mkdir()
        procs[kind] = subprocess.Popen([sys.executable, str(SUPPORT / 'checkpoint_attacks.py'), str(tmp_path / kind),
                                        kind], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        results = {kind: proc.communicate(timeout=300) for kind, proc in procs.items()}
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
    for kind, (out, err) in results.items():
        assert procs[kind].returncode == 0, (kind, procs[kind].returncode, out[-2000:], err[-3000:])
        check_shape_attacks({k: v for line in out.splitlines() if line.startswith('{')
                             for k, v in json.loads(line).items()}, kind)


# --- checkpoint writes --------------------------------------------------------------------------

def test_a_planted_link_at_the_temporary_name_is_never_written_through(tmp_path, monkeypatch):
    """Links planted at the old predictable name and at the name the writer draws first (taken from
    tempfile's name sequence, which the test intercepts): the target stays untouched."""
    target = tmp_path / 'precious'
    target.write_text('keep me')
    checkpoint = tmp_path / 'iter_2.pth'
    (tmp_path / f'iter_2.pth.tmp-{os.getpid()}').symlink_to(target)
    names = iter(['first', 'second', 'third'])
    monkeypatch.setattr(tempfile, '_get_candidate_names', lambda: names)
    (tmp_path / 'iter_2.pth.tmp-first').symlink_to(target)
    AtomicLocalBackend().put(b'weights', checkpoint)
    assert target.read_text() == 'keep me'
    assert checkpoint.read_bytes() == b'weights' and not checkpoint.is_symlink()
    assert oct(checkpoint.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ['precious', 'iter_2.pth', f'iter_2.pth.tmp-{os.getpid()}', 'iter_2.pth.tmp-first'])


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# --- downloads ----------------------------------------------------------------------------------

def _publish(server: Dict, name: str) -> Path:
    path = server['root'] / name
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({'state_dict': {'w': torch.arange(3.0)}}, path)
    return path


def test_plain_http_is_refused_unless_allowed(file_server, monkeypatch):
    _publish(file_server, 'x/model.pth')
    monkeypatch.delenv(ALLOW_HTTP, raising=False)
    with pytest.raises(CheckpointError, match=f'plain http is refused.*{ALLOW_HTTP}=1'):
        read_checkpoint(f"{file_server['url']}/x/model.pth")
    assert file_server['hits'] == {}
    monkeypatch.setenv(ALLOW_HTTP, '1')
    assert torch.equal(read_checkpoint(f"{file_server['url']}/x/model.pth")['state_dict']['w'], torch.arange(3.0))


def test_a_file_cached_from_one_url_is_never_served_for_another(file_server, monkeypatch):
    monkeypatch.setenv(ALLOW_HTTP, '1')
    name = 'xcit_small_12_p16_384_dist.pth'
    _publish(file_server, f'anyhost/{name}')
    read_checkpoint(f"{file_server['url']}/anyhost/{name}")
    official = f'https://127.0.0.1:{free_port()}/xcit/{name}'  # nothing listens: no network either
    with pytest.raises(CheckpointError, match='cannot download'):
        read_checkpoint(official)
    assert cache_path(official) != cache_path(f"{file_server['url']}/anyhost/{name}")
    assert not os.path.exists(cache_path(official))


def test_pinned_digests_are_checked_and_logged(file_server, monkeypatch):
    monkeypatch.setenv(ALLOW_HTTP, '1')
    logged = []
    monkeypatch.setattr(download, 'print_log', lambda message, **kwargs: logged.append(message))
    good = _publish(file_server, 'w/model.pth')
    digest = hashlib.sha256(good.read_bytes()).hexdigest()
    with pytest.raises(CheckpointError, match=f'has sha256 {digest}, expected 0123abcd'):
        read_checkpoint(f"{file_server['url']}/w/model.pth", sha256='0123abcd')
    assert not os.path.exists(cache_path(f"{file_server['url']}/w/model.pth"))  # refused: not cached
    read_checkpoint(f"{file_server['url']}/w/model.pth", sha256=digest)
    assert any(f'sha256 {digest}' in line for line in logged), logged
    # torch.hub's and OpenMMLab's convention: the name carries the digest's prefix
    (file_server['root'] / 'w/model-deadbeef.pth').write_bytes(good.read_bytes())
    with pytest.raises(CheckpointError, match='expected deadbeef'):
        read_checkpoint(f"{file_server['url']}/w/model-deadbeef.pth")
    (file_server['root'] / f'w/model-{digest[:8]}.pth').write_bytes(good.read_bytes())
    read_checkpoint(f"{file_server['url']}/w/model-{digest[:8]}.pth")


def test_a_url_ending_in_dotdot_stays_inside_the_cache(file_server, monkeypatch, tmp_path):
    monkeypatch.setenv(ALLOW_HTTP, '1')
    hub = Path(torch.hub.get_dir())
    before = set(hub.parent.rglob('*')) if hub.parent.exists() else set()
    with pytest.raises(CheckpointError):
        read_checkpoint(f"{file_server['url']}/x/..")
    stray = {p for p in set(hub.parent.rglob('*')) - before
             if not str(p).startswith(str(hub / 'checkpoints' / 'xcit-dense'))}
    assert stray == set()


def _download_in_child(url: str, queue) -> None:
    queue.put(read_checkpoint(url)['state_dict']['w'].tolist())


def test_one_process_per_node_downloads(file_server, monkeypatch):
    """Four processes of a node read the same URL at once: the file is fetched once."""
    monkeypatch.setenv(ALLOW_HTTP, '1')
    _publish(file_server, 'n/model.pth')
    context = multiprocessing.get_context('fork')
    queue = context.Queue()
    children = [context.Process(target=_download_in_child, args=(f"{file_server['url']}/n/model.pth", queue))
                for _ in range(4)]
    for child in children:
        child.start()
    results = [queue.get(timeout=120) for _ in children]
    for child in children:
        child.join(timeout=60)
    assert [c.exitcode for c in children] == [0] * 4
    assert results == [[0.0, 1.0, 2.0]] * 4
    assert file_server['hits'] == {'/n/model.pth': 1}


# --- the choice of the checkpoint to resume from -------------------------------------------------

def test_a_resume_skips_damaged_checkpoints_naming_each(tmp_path, monkeypatch):
    """Newer checkpoints whose meta is not what a run writes, or that the reader refuses, are named in the
    log with their reason and skipped (before: a string ``iter`` or a position without its epoch stopped the
    choice, a deep key crashed it); with none readable, one error lists each file."""
    logged = []
    monkeypatch.setattr(resume, 'print_log', lambda message, **kwargs: logged.append(message))
    save_checkpoint(resumable(1), str(tmp_path / 'iter_1.pth'))
    save_checkpoint({'state_dict': {}, 'meta': {'iter': '7'}}, str(tmp_path / 'iter_7.pth'))
    save_checkpoint({'state_dict': {}, 'meta': {'iter': 8, 'data_position': {'samples': 3}}},
                    str(tmp_path / 'iter_8.pth'))
    zip_of(tmp_path / 'iter_9.pth', key_of(pickle.EMPTY_TUPLE + pickle.TUPLE1 * 1000))
    assert find_resumable_checkpoint(str(tmp_path)) == str(tmp_path / 'iter_1.pth')
    for name, reason in (('iter_7', "iter is '7'"), ('iter_8', 'not a dict of epoch and samples'),
                         ('iter_9', 'nested more than 64 deep')):
        assert any(f'{name}.pth' in line and reason in line for line in logged), (name, logged)
    (tmp_path / 'iter_1.pth').write_bytes(b'PK\x03\x04 truncated')
    with pytest.raises(CheckpointError, match='no checkpoint in .* can be loaded') as error:
        find_resumable_checkpoint(str(tmp_path))
    assert all(f'iter_{n}.pth' in str(error.value) for n in (1, 7, 8, 9)), error.value


def test_a_resume_skips_planted_values_of_the_wrong_type_naming_each(tmp_path, monkeypatch):
    """Issue 63: newest checkpoints that the reader reads (plain values) but whose values a resume could not
    use (a seed of 'x' or 2**70, a message hub that is a string, an optimizer without parameter groups, a
    weight named backbone.blocks.x.y, a tensor in the meta, a torch RNG state of 'x' or of 65536 bytes) were
    chosen and ended the run with a traceback; each is judged whole before anything is restored, named with
    the key, and skipped, within a second of CPU each."""
    logged = []
    monkeypatch.setattr(resume, 'print_log', lambda message, **kwargs: logged.append(message))
    good = resumable(1, optimizer={'state': {}, 'param_groups': [{'lr': 0.1, 'params': [0]}]})
    save_checkpoint(good, str(tmp_path / 'iter_1.pth'))
    names = {}
    for number, case in enumerate(PLANTED_VALUES, start=10):
        names[case] = f'iter_{number}.pth'
        save_checkpoint(planted(dict(good, meta=dict(epoch=0, iter=number)), case), str(tmp_path / names[case]))
    start = time.process_time()
    assert find_resumable_checkpoint(str(tmp_path)) == str(tmp_path / 'iter_1.pth')
    assert time.process_time() - start < len(names)
    for case, (_, reason) in PLANTED_VALUES.items():
        assert any(names[case] in line and reason in line for line in logged), (case, logged)


@pytest.mark.parametrize('classes, palette, reason', [
    (torch.zeros(1, dtype=torch.uint8).expand(2 ** 16), None, "its meta's CLASSES is a Tensor, not a list"),
    (1, None, "its meta's CLASSES is 1, not a list"),
    (('a',), [1], "its meta's PALETTE[0] is 1, not a list of at most 3 items"),
    (('a',), [(1, 2, 300)], "its meta's PALETTE[0] is 300, not an integer from 0 to 255")])
def test_class_names_and_colours_of_a_released_file_are_typed(tmp_path, classes, palette, reason):
    """Issue 63: a released file's CLASSES and PALETTE became dataset_meta unchecked: a tensor's elements
    (tuple() of a zero-stride view: seconds and gigabytes), a raw TypeError for 1 or [1]; now one error
    naming the file and the key."""
    torch.save(released(classes, palette), tmp_path / 'released.pth')
    with pytest.raises(CheckpointError, match=re.escape(f'released.pth: {reason}')):
        read_checkpoint(str(tmp_path / 'released.pth'))


def test_the_scan_of_candidates_reads_no_tensor_data(tmp_path, monkeypatch):
    """Issue 63: the choice memory-mapped each candidate (a file truncated while mapped ends the process with
    SIGBUS); now it reads data.pkl alone, its tensors placeholders on the meta device. A candidate whose
    tensor records are gone is still ranked from its data.pkl, then skipped when the whole read fails."""
    monkeypatch.setattr(resume, 'print_log', lambda message, **kwargs: None)
    save_checkpoint(resumable(1), str(tmp_path / 'iter_1.pth'))
    save_checkpoint(resumable(2, state_dict={'w': torch.ones(3, 2)}), str(tmp_path / 'whole.pth'))
    with zipfile.ZipFile(tmp_path / 'whole.pth') as whole, zipfile.ZipFile(tmp_path / 'iter_2.pth', 'w') as out:
        for info in whole.infolist():
            if '/data/' not in info.filename:  # the storages' records
                out.writestr(info, whole.read(info))
    scanned = read_without_data(str(tmp_path / 'iter_2.pth'))
    assert scanned['state_dict']['w'].shape == (3, 2) and scanned['state_dict']['w'].device.type == 'meta'
    assert resume.judge_candidate(str(tmp_path / 'iter_2.pth')).iter == 2
    assert find_resumable_checkpoint(str(tmp_path)) == str(tmp_path / 'iter_1.pth')


def test_a_scheduler_or_optimizer_state_that_does_not_fit_the_built_ones_is_refused():
    """Issue 63: MMEngine's resume copies a scheduler state's keys onto the scheduler (an ``optimizer`` key
    replaced its optimizer: an AttributeError at the first step) and torch's optimizer checks group sizes
    only (a moment of another shape failed at the first step); both are judged against the ones the
    config builds, naming the key."""
    from mmengine.optim import LinearLR, OptimWrapper

    from xcit_dense.engine.training.resume_fit import check_optimizer_fits, check_schedulers_fit
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    saved = optimizer.state_dict()
    check_optimizer_fits(saved, optimizer)
    with pytest.raises(CheckpointError, match='holds the states of several optimizers, the config builds one'):
        check_optimizer_fits({'a': saved, 'b': saved}, optimizer)
    saved['state'][1]['exp_avg'] = torch.zeros(3)
    with pytest.raises(CheckpointError, match=re.escape("its optimizer state 1 'exp_avg' is of shape (3,), its "
                                                        'parameter of (2,)')):
        check_optimizer_fits(saved, optimizer)
    scheduler = LinearLR(OptimWrapper(optimizer), end=4)
    check_schedulers_fit([scheduler.state_dict()], [scheduler])
    for change, reason in ((dict(optimizer='x'), "differs from the config's LinearLR in 'optimizer'"),
                           (dict(by_epoch=1.5), "'by_epoch' is 1.5, where the config's LinearLR has True")):
        state = dict(scheduler.state_dict(), **change)
        with pytest.raises(CheckpointError, match=re.escape(reason)):
            check_schedulers_fit([state], [scheduler])
