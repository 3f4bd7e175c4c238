from yrelay.cli import cli

cli(prog_name="yrelay")
