"""Copied as ``sitecustomize.py`` into the folder the GPU machine's wheels are installed into with
``pip install --target`` (device_check.enable_pth_files): at interpreter start, run that folder's
.pth files as site-packages' would be (``xcit_mmcv_ext.pth`` installs the finder of ``mmcv._ext``)."""
import os
import site

site.addsitedir(os.path.dirname(os.path.abspath(__file__)))
