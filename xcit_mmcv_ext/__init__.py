"""mmcv 2.1.0's compiled-ops module ``mmcv._ext`` served from torchvision's and torch's kernels.

mmcv-lite (mmcv's pure-Python wheel) has every ``mmcv.ops`` module but not the compiled
``mmcv._ext`` they import. This package supplies it, so that nothing is compiled at install:

``finder``: the import finder that answers ``mmcv._ext`` (installed at interpreter start by the
``xcit_mmcv_ext.pth`` file of this distribution; standard library only); ``ext_module``: the
module it loads as ``mmcv._ext``; ``nms``, ``roi_align``, ``roi_pool``, ``deform_conv``,
``masked_conv``, ``focal_loss``, ``bbox_overlaps`` and ``ms_deform_attn``: the served ops with
mmcv 2.1.0's arguments, semantics and gradients (``precision``: the dtype they compute in);
``left_out``: every other name mmcv's ops list, raising when called.
Importing this package imports nothing else: the .pth line runs in every process of the
environment.
"""
