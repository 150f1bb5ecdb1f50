"""Helpers for the course "Making a small language model fast for narrow automation".

One module per idea, in the order the lessons meet them: ``environment``, ``models``, ``profile``, ``data`` and
``outputs`` (00); ``generation``, ``scoring`` and ``checks`` (01); ``prefix_cache`` (02); ``batching`` (03);
``timing`` (01-05); ``bench`` and ``attention`` (04); ``precision`` (05); ``plots`` and ``drawings`` (the figures);
``reference`` (the reference series' numbers); ``classify``, ``tables`` and ``resume`` (your own files).
docs/package.md says what each holds. Command line: ``python -m helpers check``, ``bench`` and ``classify``. The
course's build tools (the reference run, the notebooks' setup cell) are beside this package, in ``course/``.
"""

__version__ = "0.1.0"
