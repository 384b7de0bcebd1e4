"""The subcommands of ``blackwell-training``, one module per thing the user does: ``launch`` (validate, plan,
submit), ``follow`` (runs, watch, logs, stop, shell), ``results`` (result, curves). Each module's ``register`` adds its
subcommands to the parser and returns their handlers by name; a handler takes the command's
:class:`~constructs_lib.cli.shell.Shell` and returns the exit status."""
