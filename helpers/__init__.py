"""Helpers for the course "Making a small language model fast for narrow automation": one module per idea, in the
order the lessons meet them (docs/package.md says what each holds). Command line: ``python -m helpers check``,
``bench`` and ``classify``. The course's build tools are beside this package, in ``course/``."""

__version__ = "0.1.0"
