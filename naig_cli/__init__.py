"""The ``naig`` command line: thin Typer commands over the ``naig`` library."""
