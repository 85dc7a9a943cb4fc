"""The command-line programs: each module's ``main(argv)`` is what ``tools/<module>.py`` (and
``train.py`` for :mod:`.train`) runs, and what the ``megatron-topo-<module>`` entry point runs
(``pyproject.toml``'s ``[project.scripts]``, ``_`` written ``-``).

They live in the package so tests and other programs import them like any module; the files in
``tools/`` are thin launchers. A command module holds its options, its one ``error:`` line, its
printing and the glue; what other code reuses lives in the layer it belongs to (``data/``,
``analysis/``, ``zero_topo/`` ...).
"""
