"""The command-line programs: each module's ``main(argv)`` is what ``tools/<module>.py`` runs.

They live in the package so tests and other programs import them like any module; the files in
``tools/`` are thin launchers.
"""
