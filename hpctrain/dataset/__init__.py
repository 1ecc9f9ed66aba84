"""Datasets on disk, torch-free: the ImageFolder index, packed SquashFS images (pack, check, mount).

``index`` (one scan of a split), ``squashfs`` (what an image file is and holds,
read without mounting it), ``pack`` (``hpctrain pack``), ``generate`` (``hpctrain
make-dataset``: a small synthetic ImageFolder), ``mount`` (a node
mounts an image once for its tasks, and unmounts it when they end).
"""
