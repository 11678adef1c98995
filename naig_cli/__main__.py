"""``python -m naig_cli`` runs the ``naig`` app."""

from naig_cli.main import app

app(prog_name="naig")
