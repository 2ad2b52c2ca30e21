"""The data-file check before a run, kept importable here: it lives in ``xcit_launch.preflight``,
which the launch scripts import without torch, mmdet or mmseg."""
from xcit_launch.preflight import (  # noqa: F401
                                   HINT,
                                   TEST_LOADERS,
                                   TRAIN_LOADERS,
                                   DataFilesError,
                                   check_annotation_file,
                                   check_data_files,
                                   config_datasets,
                                   parse_cfg_options,
                                   preflight,
)
