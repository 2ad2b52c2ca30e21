"""The README stays a five-minute read; the user docs (docs/) stay what a user reads, short, and true
about how checkpoints are read; every relative link and anchor of the pages, and every repository
path they name, resolves."""
import re
from pathlib import Path
from typing import List, Set

import pytest
from helpers import ROOT

pytestmark = pytest.mark.quick  # static checks of the pages, under a second in all

README_MAX_LINES = 250
README_MAX_WORDS = 1200
# A path the docs name that starts with one of the repository's top-level names (in code or prose).
TOP_LEVEL = ('.ci', 'benchmarks', 'configs', 'dev', 'docs', 'requirements', 'tests', 'tools', 'xcit_dense',
             'xcit_launch', 'xcit_mmcv_ext', 'setup.py', 'pytest.ini', 'model-index.yml', 'CITATION.cff')
NAMED_PATH = re.compile(r'(?<![\w./~:-])((?:' + '|'.join(re.escape(t) for t in TOP_LEVEL)
                        + r')(?:/[\w.*-]+)*/?)(?![\w/])')
# Another project's path, named as its own ("mmdet's tools/analysis_tools/analyze_logs.py", in code or prose):
# not the toolkit's, whether or not the toolkit has a file of that name. (A path inside an install,
# $MMDET/train.py or mmdet/.mim/tools/..., is no repository path: NAMED_PATH starts none after a / or $.)
OTHER_PROJECTS = ('mmdet', 'mmseg', 'mmengine', 'mmcv', 'mmdetection', 'mmsegmentation', 'detectron2', 'timm', 'torch')
ANOTHER_PROJECTS = re.compile(r"\b(?:" + '|'.join(OTHER_PROJECTS) + r")'s\s+`?$", re.I)
# Paths the docs name that are not in the repository: other projects' files, users' examples, what
# an install makes.
NOT_IN_THE_REPOSITORY = {
    'docs/notes/benchmarks.md': "detectron2's",
    'configs/my_shapes.py': "a user's config in an example", 'xcit_dense/.mim/': 'made by the install (setup.py)'}
FENCE = re.compile(r'^\s*(```|~~~)')
HEADING = re.compile(r'^#{1,6}\s+(.*?)\s*#*\s*$')
LINK = re.compile(r'!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)')
CODE_SPAN = re.compile(r'(`+).*?\1')
# The user docs: what a user reads. Measurements go to benchmarks/reports/, team notes to dev/.
USER_DOCS_MAX_WORDS = 20000
# A page saying checkpoints are read with torch's weights-only switch: the toolkit reads every checkpoint
# with its own checked unpickler and never calls torch.load with it (xcit_dense/checked_unpickler.py).
WEIGHTS_ONLY_CLAIM = re.compile(r"weights_only\s*=\s*True|(?<!torch's )\bweights[ -]only\b", re.I)


def user_docs() -> List[Path]:
    return sorted((ROOT / 'docs').rglob('*.md'))


def markdown_files() -> List[Path]:
    """The pages whose links are checked: the README, the user docs, the model zoo, the team's notes
    and the benchmarks' reports."""
    return [ROOT / 'README.md', *user_docs(), ROOT / 'configs/xcit/README.md', *sorted((ROOT / 'dev').rglob('*.md')),
            *sorted((ROOT / 'benchmarks').rglob('*.md'))]


def prose(path: Path) -> List[str]:
    """The page's lines, those of fenced code blocks emptied and code spans blanked outside headings."""
    lines, fenced = [], False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
            line = ''
        lines.append('' if fenced else line if HEADING.match(line) else CODE_SPAN.sub('', line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lowercased, punctuation dropped, spaces as hyphens."""
    text = re.sub(r'!?\[([^\]]*)\]\([^)]*\)', r'\1', heading)  # a link's text only
    text = re.sub(r'[`*]', '', text).strip().lower()
    return re.sub(r'[^\w\- ]', '', text).replace(' ', '-')


def anchors(path: Path) -> Set[str]:
    """Every anchor the page's headings make, repeated ones numbered as GitHub numbers them."""
    seen: Set[str] = set()
    for line in prose(path):
        match = HEADING.match(line)
        if match:
            base = anchor = slug(match.group(1))
            count = 0
            while anchor in seen:
                count += 1
                anchor = f'{base}-{count}'
            seen.add(anchor)
    return seen


def broken_links(path: Path) -> List[str]:
    """'page:line: target (why)' for each relative link of the page that does not resolve."""
    broken, text = [], '\n'.join(prose(path))
    for link in LINK.finditer(text):  # a link's text may run over several lines
        target, number = link.group(1), text.count('\n', 0, link.start()) + 1
        if not target or re.match(r'[a-z][a-z0-9+.-]*:', target, re.I):
            continue  # a URL (https:, mailto:) is not checked here
        file_part, _, anchor = target.partition('#')
        where = (path.parent / file_part).resolve() if file_part else path
        if not where.exists():
            broken.append(f'{shown(path)}:{number}: {target} (no such file)')
        elif anchor and where.suffix == '.md' and anchor not in anchors(where):
            broken.append(f'{shown(path)}:{number}: {target} (no such heading)')
    return broken


def shown(path: Path) -> str:
    """The page's name as a report gives it: relative to the repository when inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def missing_paths(path: Path) -> List[str]:
    """'page:line: path' for each repository path the page names (code and prose alike) that does
    not exist; a glob (``tests/integration/test_faults_*.py``) must match a file. Another project's
    path (ANOTHER_PROJECTS) is not the toolkit's."""
    missing = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        for match in NAMED_PATH.finditer(line):
            named = match.group(1).rstrip('.')
            if ('/' not in named and named not in TOP_LEVEL) or named in NOT_IN_THE_REPOSITORY \
                    or ANOTHER_PROJECTS.search(line[:match.start()]):
                continue
            exists = any(ROOT.glob(named)) if '*' in named else (ROOT / named).exists()
            if not exists:
                missing.append(f'{shown(path)}:{number}: {named}')
    return missing


def test_readme_is_a_five_minute_read():
    text = (ROOT / 'README.md').read_text()
    lines, words = len(text.splitlines()), len(text.split())
    assert lines < README_MAX_LINES, f'README.md has {lines} lines'
    assert words <= README_MAX_WORDS, f'README.md has {words} words'


def weights_only_claims(path: Path) -> List[str]:
    """'page:line: text' for each line of the page that says checkpoints are read weights-only."""
    return [f'{shown(path)}:{number}: {match.group(0)}'
            for number, line in enumerate(path.read_text().splitlines(), 1)
            for match in WEIGHTS_ONLY_CLAIM.finditer(line)]


def test_docs_hold_no_scripts():
    scripts = [shown(path) for path in (ROOT / 'docs').rglob('*.py')]
    assert not scripts, f'scripts under docs/ (they belong beside what they serve, e.g. dev/): {scripts}'


def test_user_docs_are_short():
    words = {shown(page): len(page.read_text().split()) for page in user_docs()}
    assert sum(words.values()) < USER_DOCS_MAX_WORDS, (
        f'the user docs hold {sum(words.values())} words (measurement reports go to benchmarks/reports/, '
        f'team notes to dev/): {words}')


def test_no_page_says_checkpoints_are_read_weights_only():
    claims = [claim for page in [ROOT / 'README.md', *user_docs(), ROOT / 'configs/xcit/README.md']
              for claim in weights_only_claims(page)]
    assert not claims, '\n'.join(claims)


def test_the_weights_only_check_sees_the_claims(tmp_path):
    page = tmp_path / 'page.md'
    page.write_text("read with `torch.load(weights_only=True)`\nThe file is read weights only.\n"
                    "a weights-only load\nMMEngine's readers use `weights_only=False`;\n"
                    "`TORCH_FORCE_WEIGHTS_ONLY_LOAD=1`; stricter than torch's weights-only unpickler\n")
    assert [claim.split(': ', 1)[0].rsplit(':', 1)[1] for claim in weights_only_claims(page)] == ['1', '2', '3']


def test_every_repository_path_the_docs_name_exists():
    missing = [problem for page in markdown_files() for problem in missing_paths(page)]
    assert not missing, '\n'.join(missing)


def test_the_path_check_sees_stale_paths(tmp_path):
    page = tmp_path / 'page.md'
    page.write_text('see `tests/test_faults_*.py` and xcit_dense/benchmark/cli.py, not tools/train.py,\n'
                    '`tests/integration/test_faults_*.py`, `configs/xcit/`, '
                    'mmdet\'s tools/analysis_tools/analyze_logs.py, mmseg\'s `tools/dist_test_mmseg.sh`\n'
                    'or https://example.org/tools/nothing.py, $MMDET/tools/analysis_tools/analyze_logs.py; '
                    'tools/analysis_tools/analyze_logs.py of ours\n')
    assert [problem.split(': ', 1)[1] for problem in missing_paths(page)] == [
        'tests/test_faults_*.py', 'xcit_dense/benchmark/cli.py', 'tools/analysis_tools/analyze_logs.py']


def test_every_relative_link_and_anchor_resolves():
    broken = [problem for page in markdown_files() for problem in broken_links(page)]
    assert not broken, '\n'.join(broken)


def test_the_readme_model_zoo_has_the_zoo_pages_figures():
    """The README's short table repeats configs/xcit/README.md's figures (which test_model_zoo checks)."""
    zoo = {}
    for line in (ROOT / 'configs/xcit/README.md').read_text().splitlines():
        config = re.search(r'\[config\]\(\w+?_xcit_(\w+)_p(\d+)_\w+\.py\)', line)
        if config:
            numbers = [c.strip() for c in line.split('|') if re.fullmatch(r'\d+\.\d', c.strip())]
            zoo.setdefault(config.groups(), []).extend(numbers[:2] if 'mask_rcnn' in line else numbers[:1])
    sizes = {'T12': 'tiny_12', 'S12': 'small_12', 'S24': 'small_24', 'M24': 'medium_24'}
    readme = {}
    for line in (ROOT / 'README.md').read_text().splitlines():
        row = re.fullmatch(r'\| XCiT-(\w+) \| (\d+) \|(.*)\|', line)
        if row:
            readme[sizes[row.group(1)], row.group(2)] = [c.strip() for c in row.group(3).split('|')]
    assert len(readme) == 8 and readme == zoo


def test_the_checker_sees_what_github_renders(tmp_path):
    """GitHub's anchor rule; links in code left alone, links over two lines and repeated headings seen."""
    assert slug('Several nodes with Slurm') == 'several-nodes-with-slurm'
    assert slug('`tools/train.py`: options, AMP & resume') == 'toolstrainpy-options-amp--resume'
    assert slug('[Security](security.md) (checkpoints)') == 'security-checkpoints'
    page = tmp_path / 'page.md'
    page.write_text('# Notes\n\n## Notes\n\nsee [a](x.md#b), `[not](a-link)` and ![c](d.png "title")\n'
                    '```\n[in](code.md)\n```\n[over two\nlines](#notes-1) [wrong](#notes-2)\n')
    assert anchors(page) == {'notes', 'notes-1'}
    assert [problem.split(': ', 1)[1] for problem in broken_links(page)] == [
        'x.md#b (no such file)', 'd.png (no such file)', '#notes-2 (no such heading)']
