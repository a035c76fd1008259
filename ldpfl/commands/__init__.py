"""The click commands: one module per ``ldpfl`` subcommand, each mapping its flags onto a job of ``ldpfl.api``.

``ldpfl.cli`` lists them (``LAZY_COMMANDS``) and imports one only when it runs, so ``ldpfl --help`` imports none.
"""
