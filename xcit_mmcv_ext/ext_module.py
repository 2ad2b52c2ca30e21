"""The module loaded as ``mmcv._ext`` by ``finder`` (mmcv-lite installed, no compiled mmcv).

It holds mmcv 2.1.0's served functions under mmcv's names, the two build-information functions
mmcv's ``collect_env`` calls, and a raising function for every other name (``left_out``).
"""
from xcit_mmcv_ext.bbox_overlaps import bbox_overlaps
from xcit_mmcv_ext.deform_conv import (
    deform_conv_backward_input,
    deform_conv_backward_parameters,
    deform_conv_forward,
    modulated_deform_conv_backward,
    modulated_deform_conv_forward,
)
from xcit_mmcv_ext.focal_loss import (
    sigmoid_focal_loss_backward,
    sigmoid_focal_loss_forward,
    softmax_focal_loss_backward,
    softmax_focal_loss_forward,
)
from xcit_mmcv_ext.left_out import LEFT_OUT, left_out_op
from xcit_mmcv_ext.masked_conv import masked_col2im_forward, masked_im2col_forward
from xcit_mmcv_ext.ms_deform_attn import ms_deform_attn_backward, ms_deform_attn_forward
from xcit_mmcv_ext.nms import nms, nms_match, softnms
from xcit_mmcv_ext.roi_align import roi_align_backward, roi_align_forward
from xcit_mmcv_ext.roi_pool import roi_pool_backward, roi_pool_forward

NOT_COMPILED = "not compiled (xcit-dense's mmcv._ext on torchvision's and torch's kernels)"

SERVED = ('nms', 'softnms', 'nms_match', 'roi_align_forward', 'roi_align_backward', 'roi_pool_forward',
          'roi_pool_backward', 'deform_conv_forward', 'deform_conv_backward_input',
          'deform_conv_backward_parameters', 'modulated_deform_conv_forward', 'modulated_deform_conv_backward',
          'masked_im2col_forward', 'masked_col2im_forward', 'sigmoid_focal_loss_forward',
          'sigmoid_focal_loss_backward', 'softmax_focal_loss_forward', 'softmax_focal_loss_backward',
          'bbox_overlaps', 'ms_deform_attn_forward', 'ms_deform_attn_backward')


def get_compiler_version() -> str:
    """What mmcv's ``collect_env`` reports as its C++ compiler: none was used."""
    return NOT_COMPILED


def get_compiling_cuda_version() -> str:
    """What mmcv's ``collect_env`` reports as its CUDA compiler: none was used."""
    return NOT_COMPILED


globals().update({name: left_out_op(name) for name in LEFT_OUT})

__all__ = [*SERVED, 'get_compiler_version', 'get_compiling_cuda_version', *LEFT_OUT]
