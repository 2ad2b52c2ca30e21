# UperNet (plus an auxiliary FCN head on pyramid level 3) on an XCiT patch-8 backbone, for ADE20K.
# The patch-16 base with patch_size 8 (the pyramid adapter follows the patch size).
_base_ = './upernet_xcit_p16.py'

model = dict(backbone=dict(patch_size=8))
