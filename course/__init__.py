"""The course's own build tools, kept out of the ``helpers`` package a reader imports: ``reference_run`` (``make
reference``) and ``setup_cells`` (every notebook's first cell). Run them from the course folder, as
``python -m course.reference_run`` and ``python -m course.setup_cells``."""
