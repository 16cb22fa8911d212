"""`python -m loadgen.cli`."""

from .main import main

main()
