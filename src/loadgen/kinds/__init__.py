"""Run kinds as plugins: one folder per command that writes a run, above the CLI's shell.

A kind's folder holds its command (the click options it takes beyond the shared groups of
cli/shared.py, and how it builds its run), and may hold its view; core/kinds.py `KINDS` is the one
list that names them, by import strings, so nothing below this layer imports a kind. Adding one:
docs/development.md, "Adding a command".
"""
