"""The shared test helpers: process-group reaping, capability skips and their summary, and the
repository snapshot behind the session's cleanliness check."""
import subprocess
import sys
import time
from pathlib import Path

import helpers
import pytest
from helpers import CAPABILITY_MISSING, repo_state, require_capability, run


def alive(pid: int) -> bool:
    """Whether pid is a live (not zombie) process."""
    try:
        return Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[0] != 'Z'
    except (FileNotFoundError, IndexError):
        return False


def test_run_kills_the_whole_process_group_on_timeout(tmp_path):
    """A grandchild (as torchrun's workers are) does not outlive a command that timed out."""
    pid_file = tmp_path / 'pid'
    with pytest.raises(subprocess.TimeoutExpired, match='timed out after 2 seconds'):
        run(['bash', '-c', f'sleep 300 & echo $! > {pid_file}; wait'], timeout=2)
    pid = int(pid_file.read_text())
    deadline = time.time() + 10
    while alive(pid) and time.time() < deadline:
        time.sleep(0.1)
    assert not alive(pid)


def test_run_captures_text_in_the_launch_environment():
    proc = run([sys.executable, '-c', 'import os, sys; print(os.environ["PYTHON"]); sys.exit(3)'])
    assert proc.returncode == 3 and proc.stdout.strip() == sys.executable


def test_missing_capability_skips_with_a_marked_reason(monkeypatch):
    monkeypatch.delenv('CI', raising=False)
    with pytest.raises(pytest.skip.Exception, match=f'^{CAPABILITY_MISSING} tmpfs: no mount here$'):
        require_capability('tmpfs', False, 'no mount here')
    require_capability('tmpfs', True, 'no mount here')  # available: nothing happens


def test_missing_capability_fails_under_ci_where_the_machine_has_it(monkeypatch):
    monkeypatch.setenv('CI', 'true')
    monkeypatch.setitem(helpers.MACHINE_HAS, 'tmpfs', lambda: True)
    with pytest.raises(pytest.fail.Exception, match='CI=true on a machine that should have tmpfs'):
        require_capability('tmpfs', False, 'no mount here')
    monkeypatch.setitem(helpers.MACHINE_HAS, 'tmpfs', lambda: False)
    with pytest.raises(pytest.skip.Exception, match=f'^{CAPABILITY_MISSING} tmpfs: no mount here$'):
        require_capability('tmpfs', False, 'no mount here')


def test_summary_lists_each_missing_capability(tmp_path):
    """The 'capabilities missing' block of a run: one line per capability, with its count."""
    (tmp_path / 'pytest.ini').write_text('[pytest]\n')
    (tmp_path / 'test_caps.py').write_text(
        'import pytest\n'
        'from helpers import require_capability\n'
        '@pytest.mark.parametrize("n", [1, 2])\n'
        'def test_mount(n):\n'
        '    require_capability("tmpfs", False, "no mount here")\n'
        'def test_chattr():\n'
        '    require_capability("chattr", False, "no attributes")\n'
        'def test_plain_skip():\n'
        '    pytest.skip("not a capability")\n')
    # tests/conftest.py as a plugin (tests/ is on launch_env's PYTHONPATH): its pytest_terminal_summary
    proc = run([sys.executable, '-m', 'pytest', str(tmp_path), '-q', '-p', 'no:cacheprovider', '-p', 'conftest',
                '-rs', '-c', str(tmp_path / 'pytest.ini')], cwd=tmp_path,
               env=helpers.launch_env(CI='false'), timeout=300)
    assert '4 skipped' in proc.stdout, proc.stdout + proc.stderr
    block = proc.stdout.split('capabilities missing', 1)[1]
    assert 'chattr: no attributes (1 test(s) skipped)' in block
    assert 'tmpfs: no mount here (2 test(s) skipped)' in block
    assert 'not a capability' not in block.split('short test summary')[0]


def test_repo_state_sees_new_files_even_in_ignored_folders(tmp_path):
    subprocess.run(['git', 'init', '-q', str(tmp_path)], check=True)
    (tmp_path / '.gitignore').write_text('work_dirs/\n__pycache__/\n')
    (tmp_path / 'work_dirs' / 'old').mkdir(parents=True)
    (tmp_path / 'work_dirs' / 'old' / 'a.log').write_text('')
    before = repo_state(tmp_path)
    (tmp_path / 'work_dirs' / 'old' / 'b.pth').write_text('')
    (tmp_path / 'configs').mkdir()
    (tmp_path / 'configs' / 'new.py').write_text('')
    (tmp_path / '__pycache__').mkdir()
    (tmp_path / '__pycache__' / 'm.cpython-311.pyc').write_text('')
    assert repo_state(tmp_path) - before == {'!! work_dirs/old/b.pth', '?? configs/new.py'}
