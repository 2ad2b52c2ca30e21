"""Datasets: synthetic sets in the COCO and ADE20K formats."""
