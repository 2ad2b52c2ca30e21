"""Command-line tools: parameter counts, checkpoint conversion and the smoke run, as users run them."""
import torch
from helpers import ROOT, randomize_, run_tool_in_process

from xcit_dense.models.presets import PRESETS
from xcit_dense.models.xcit import XCiT


def run_tool(tool, *args, check=True):
    """The tool as users run it (``python TOOL ARGS`` from the repository), in this process: none of
    these needs a process of its own, and an interpreter start costs 6-10 s."""
    proc = run_tool_in_process(tool, *args, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f'{tool} {args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}')
    return proc


def test_count_params_prints_every_preset():
    out = run_tool('tools/analysis_tools/count_params.py').stdout
    rows = [line for line in out.splitlines() if line.startswith('| ') and line[2].isalpha()
            and not line.startswith('| arch')]
    assert len(rows) == 2 * len(PRESETS)
    for row in rows:  # arch, patch, D, depth, heads, eta as in the presets
        arch, patch, dims, depth, heads, eta = (c.strip() for c in row.split('|')[1:7])
        preset = PRESETS[arch]
        assert (int(dims), int(depth), int(heads), float(eta)) == (
            preset.embed_dims, preset.depth, preset.num_heads, preset.eta), row
        assert int(patch) in (16, 8)
    cells = next(r for r in rows if r.startswith('| small_12 | 16 ')).split('|')
    dense, pyramid, classifier = (float(cells[i]) for i in (7, 8, 9))
    assert round(classifier) == 26  # XCiT-S12/16 in the paper: 26M
    assert 0 < pyramid < dense < classifier


def test_convert_official_checkpoint(tmp_path):
    state = randomize_(XCiT(arch='tiny_12', patch_size=8), seed=5).state_dict()
    official = {k.replace('pos_embed.', 'pos_embeder.'): v for k, v in state.items() if not k.startswith('fpn')}
    official['head.weight'] = torch.zeros(1000, 192)
    torch.save({'model': official}, tmp_path / 'official.pth')
    precious = tmp_path / 'precious'
    precious.write_text('keep me')
    (tmp_path / 'dense.pth.tmp').symlink_to(precious)  # planted where the tool once wrote its temporary file
    run_tool('tools/model_converters/convert_xcit_checkpoint.py', tmp_path / 'official.pth', tmp_path / 'dense.pth',
             '--arch', 'tiny_12', '--patch-size', '8')
    assert precious.read_text() == 'keep me' and not (tmp_path / 'dense.pth').is_symlink()
    converted = torch.load(tmp_path / 'dense.pth', weights_only=True)
    assert 'backbone.pos_embed.token_projection.weight' in converted['state_dict']
    assert not any('head' in k for k in converted['state_dict'])
    model = XCiT(arch='tiny_12', patch_size=8,
                 init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'dense.pth')))
    model.init_weights()
    assert torch.equal(model.blocks[5].attn.qkv.weight, state['blocks.5.attn.qkv.weight'])


def test_convert_refuses_another_architecture(tmp_path):
    torch.save({'model': XCiT(arch='small_12').state_dict()}, tmp_path / 'small.pth')
    proc = run_tool('tools/model_converters/convert_xcit_checkpoint.py', tmp_path / 'small.pth', tmp_path / 'out.pth',
                    '--arch', 'tiny_12', '--patch-size', '16', check=False)
    assert proc.returncode != 0 and 'shape mismatches' in proc.stderr
    assert not (tmp_path / 'out.pth').exists()


def test_smoke_runs_mask_rcnn_and_upernet(tmp_path):
    out = run_tool('tools/misc/smoke.py', '--size', '128', '160', '--work-dir', tmp_path).stdout
    assert 'mask_rcnn_xcit_p16.py: XCiT-small_12/16 -> ' in out and 'masks (' in out
    assert 'upernet_xcit_p16.py: XCiT-small_12/16 -> segmentation map (1, 128, 160)' in out
    assert out.rstrip().endswith('[smoke] OK')
