"""The dataset index lives in ``hpctrain.dataset.index`` (torch-free: ``hpctrain pack`` writes it too)."""

from hpctrain.dataset.index import (  # noqa: F401
    IMG_EXTENSIONS,
    INDEX_VERSION,
    Broadcast,
    DatasetIndex,
    IndexError_,
    cache_key,
    cached_index,
    scan_split,
    shared_index,
    torch_broadcast,
)
