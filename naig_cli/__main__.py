"""``python -m naig_cli`` runs the ``naig`` program (``naig_cli.entry``)."""

from naig_cli.entry import main

main()
