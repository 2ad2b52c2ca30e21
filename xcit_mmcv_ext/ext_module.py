"""The module loaded as ``mmcv._ext`` by ``finder`` (mmcv-lite installed, no compiled mmcv).

It holds mmcv 2.1.0's served functions under mmcv's names, the two build-information functions
mmcv's ``collect_env`` calls, and a raising function for every other name (``left_out``).
"""
from xcit_mmcv_ext.left_out import LEFT_OUT, left_out_op
from xcit_mmcv_ext.nms import nms, nms_match, softnms
from xcit_mmcv_ext.roi_align import roi_align_backward, roi_align_forward

NOT_COMPILED = "not compiled (xcit-dense's mmcv._ext on torchvision's kernels)"


def get_compiler_version() -> str:
    """What mmcv's ``collect_env`` reports as its C++ compiler: none was used."""
    return NOT_COMPILED


def get_compiling_cuda_version() -> str:
    """What mmcv's ``collect_env`` reports as its CUDA compiler: none was used."""
    return NOT_COMPILED


globals().update({name: left_out_op(name) for name in LEFT_OUT})

__all__ = ['nms', 'softnms', 'nms_match', 'roi_align_forward', 'roi_align_backward', 'get_compiler_version',
           'get_compiling_cuda_version', *LEFT_OUT]
