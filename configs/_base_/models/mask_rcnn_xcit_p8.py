# Mask R-CNN with FPN on an XCiT patch-8 backbone (the authors' COCO model).
# The patch-16 base with patch_size 8 (the pyramid adapter follows the patch size).
_base_ = './mask_rcnn_xcit_p16.py'

model = dict(backbone=dict(patch_size=8))
