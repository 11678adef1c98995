"""``python -m naig`` runs the ``naig`` command line (the same program as the ``naig`` script)."""

from naig_cli.entry import main

main()
