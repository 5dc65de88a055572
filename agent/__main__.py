"""`python -m agent` and /usr/bin/edge-agent: the command line (cli.py). For `run`, no
garbage collection until the agent is built (cli.cmd_run says why and turns it back
on): the modules the command line loads first are made under the same rule."""
import gc
import sys


def main() -> int:
    if sys.argv[1:2] == ["run"]:
        gc.disable()
    from .cli import main as cli_main
    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
