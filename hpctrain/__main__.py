"""``python -m hpctrain`` is the ``hpctrain`` command."""

from hpctrain.cli.main import command_line

command_line()
