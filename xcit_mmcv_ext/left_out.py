"""The names mmcv 2.1.0's ``mmcv.ops`` modules ask of ``mmcv._ext`` that are not served here.

Each ``mmcv/ops/<op>.py`` asserts at import that ``mmcv._ext`` has the names it lists; every op
module must import, so each name exists, as a function that raises ``NotImplementedError`` naming
the op, the stock mmdet 3.3.0 / mmseg 1.2.2 configs that need it, and the install that has it.
Nothing is approximated. RoIAlign's max pooling is refused in roi_align.py. docs/install.md lists
the same ops.
"""
from typing import Callable, NoReturn

INSTALL_COMPILED = 'XCIT_MMCV=compiled bash tools/install.sh'

# the stock configs that call a left-out op, by the prefix of its mmcv._ext names
STOCK_CONFIGS = {
    'carafe': 'mmdet configs/carafe (CARAFE upsampling)',
    'deform_roi_pool': "mmdet configs/dcn and configs/dcnv2 '*dpool*' (DeformRoIPoolPack)",
    'sync_bn': "norm_cfg=dict(type='MMSyncBN'): mmdet configs/simple_copy_paste, configs/strong_baselines",
    'psamask': 'mmseg configs/psanet (PSAMask)',
}
NO_STOCK_CONFIG = 'no mmdet 3.3.0 or mmseg 1.2.2 config (rotated, 3-D, generative, OCR and tracking ops)'

LEFT_OUT = (
    'active_rotated_filter_backward', 'active_rotated_filter_forward', 'assign_score_withk_backward',
    'assign_score_withk_forward', 'ball_query_forward', 'bezier_align_backward', 'bezier_align_forward', 'bias_act',
    'border_align_backward', 'border_align_forward', 'box_iou_quadri', 'box_iou_rotated', 'carafe_backward',
    'carafe_forward', 'carafe_naive_backward', 'carafe_naive_forward', 'chamfer_distance_backward',
    'chamfer_distance_forward', 'contour_expand', 'convex_giou', 'convex_iou', 'correlation_backward',
    'correlation_forward', 'deform_roi_pool_backward', 'deform_roi_pool_forward',
    'diff_iou_rotated_sort_vertices_forward', 'dynamic_point_to_voxel_backward', 'dynamic_point_to_voxel_forward',
    'dynamic_voxelize_forward', 'filtered_lrelu', 'filtered_lrelu_act_', 'furthest_point_sampling_forward',
    'furthest_point_sampling_with_dist_forward', 'fused_bias_leakyrelu', 'fused_indice_conv_forward',
    'gather_points_backward', 'gather_points_forward', 'get_indice_pairs_2d_backward',
    'get_indice_pairs_2d_forward', 'get_indice_pairs_3d_backward', 'get_indice_pairs_3d_forward',
    'get_indice_pairs_4d_forward', 'group_points_backward', 'group_points_forward', 'hard_voxelize_forward',
    'indice_conv_backward', 'indice_conv_forward', 'indice_maxpool_backward', 'indice_maxpool_forward',
    'iou3d_boxes_overlap_bev_forward', 'iou3d_nms3d_forward', 'iou3d_nms3d_normal_forward', 'knn_forward',
    'min_area_polygons', 'nms_quadri', 'nms_rotated', 'pixel_group', 'points_in_boxes_all_forward',
    'points_in_boxes_cpu_forward', 'points_in_boxes_part_forward', 'points_in_polygons_forward',
    'prroi_pool_backward', 'prroi_pool_coor_backward', 'prroi_pool_forward', 'psamask_backward', 'psamask_forward',
    'riroi_align_rotated_backward', 'riroi_align_rotated_forward', 'roi_align_rotated_backward',
    'roi_align_rotated_forward', 'roiaware_pool3d_backward', 'roiaware_pool3d_forward', 'roipoint_pool3d_forward',
    'rotated_feature_align_backward', 'rotated_feature_align_forward', 'stack_ball_query_forward',
    'stack_group_points_backward', 'stack_group_points_forward', 'sync_bn_backward_data', 'sync_bn_backward_param',
    'sync_bn_forward_mean', 'sync_bn_forward_output', 'sync_bn_forward_var', 'three_interpolate_backward',
    'three_interpolate_forward', 'three_nn_forward', 'tin_shift_backward', 'tin_shift_forward', 'upfirdn2d',
)


def stock_configs(op: str) -> str:
    """The stock configs that need the left-out ``op``."""
    for prefix, configs in STOCK_CONFIGS.items():
        if op.startswith(prefix):
            return configs
    return NO_STOCK_CONFIG


def not_served(op: str, what: str = '') -> NotImplementedError:
    """The error for an op (or a mode of one) that needs compiled mmcv."""
    return NotImplementedError(f"mmcv op '{op}'{what} needs compiled mmcv: xcit-dense's default install "
                               f"serves mmcv._ext from torchvision's and torch's kernels and has no such kernel "
                               f'(used by: {stock_configs(op)}). Install compiled mmcv with: {INSTALL_COMPILED}')


def left_out_op(op: str) -> Callable[..., NoReturn]:
    """A function named ``op`` that raises ``not_served(op)`` whatever it is called with."""
    def raise_not_served(*args: object, **kwargs: object) -> NoReturn:
        raise not_served(op)
    raise_not_served.__name__ = raise_not_served.__qualname__ = op
    raise_not_served.__doc__ = f"mmcv's '{op}', not served without compiled mmcv: raises NotImplementedError."
    return raise_not_served
