"""`python -m ale.cli ...` runs the `ale` command."""

from ale.cli.main import main

main()
