"""``hpctrain report``: plots and tables from finished (or running) runs and studies. Torch-free.

``load`` reads run directories into plain dataclasses, ``table`` computes the
scaling table (pure), ``plots`` draws PNGs (matplotlib, the ``plots`` extra),
``render`` writes report.md and a self-contained report.html, ``baselines``
holds published reference numbers.
"""
