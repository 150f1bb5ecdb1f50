"""Helpers for the course "Making a small language model fast for narrow automation".

One module per idea, in the order the notebooks introduce them:
``bootstrap`` (every notebook's setup cell), ``environment`` and ``models`` (00), ``profile`` (00: the machine
profile's measured curves), ``data`` (00), ``timing`` (01-04: clocks synchronised with the GPU),
``scoring`` (01), ``prefix_cache`` (02), ``batching`` (03), ``bench`` and ``plots`` (04), and ``classify`` for
your own files.
Command line: ``python -m helpers check``, ``bench``, ``classify`` and ``setup-cells``.
"""

__version__ = "0.1.0"
