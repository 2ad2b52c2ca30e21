# Option, not the authors' recipe: the Mask R-CNN XCiT-S12/16 3x recipe with layer-wise
# learning-rate decay 0.7 (ViTDet's value for ViT-B). The patch embedding and positional
# encoding train at 0.7 ** 13 of the learning rate, block i at 0.7 ** (12 - i), and the
# pyramid, neck and heads at the full rate. Everything else, including the recipe's
# no-weight-decay rule for the LayerNorms (custom_keys 'norm'), comes from the base config;
# the constructor applies the decay on top of those rules.
_base_ = '../xcit/mask_rcnn_xcit_small_12_p16_3x_coco.py'

optim_wrapper = dict(
    constructor='XCiTLayerDecayOptimizerConstructor',
    paramwise_cfg=dict(layer_decay_rate=0.7))
