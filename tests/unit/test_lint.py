"""The tree passes `ruff check` under ruff.toml (line length 120, import order, unused names), with the ruff
that requirements/tests.txt pins."""
import subprocess
import sys

import pytest
from helpers import ROOT

pytestmark = pytest.mark.quick


def test_ruff_check_passes():
    run = subprocess.run([sys.executable, '-m', 'ruff', 'check', '--no-cache', '--output-format', 'concise', '.'],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f'ruff check found:\n{run.stdout}{run.stderr}'


def test_ruff_is_the_pinned_one():
    pinned = next(line.split('==')[1].strip() for line in (ROOT / 'requirements/tests.txt').read_text().splitlines()
                  if line.startswith('ruff=='))
    run = subprocess.run([sys.executable, '-m', 'ruff', '--version'], capture_output=True, text=True, timeout=60)
    assert run.stdout.split() == ['ruff', pinned], run.stdout + run.stderr
