"""``python -m naig`` runs the ``naig`` command line (the same app as the ``naig`` script)."""

from naig_cli.main import app

app(prog_name="naig")
