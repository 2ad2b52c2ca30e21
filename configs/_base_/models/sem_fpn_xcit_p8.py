# Semantic FPN on an XCiT patch-8 backbone, for ADE20K's 150 classes.
# The patch-16 base with patch_size 8 (the pyramid adapter follows the patch size).
_base_ = './sem_fpn_xcit_p16.py'

model = dict(backbone=dict(patch_size=8))
