"""Shared by the examples: where the shardfeed CLI is, and how to run it."""
import os
import shutil
import subprocess
import sys
import tempfile


def cli():
    """The shardfeed command: $SHARDFEED_CLI, else the one on PATH."""
    path = os.environ.get("SHARDFEED_CLI") or shutil.which("shardfeed")
    if not path:
        sys.exit("shardfeed CLI not found: put it on PATH or set SHARDFEED_CLI")
    return path


def pack(*args):
    """Runs `shardfeed pack ARGS -q`, stopping the example with its message if it fails."""
    p = subprocess.run([cli(), "pack", *map(str, args), "-q"], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(p.stderr)
    print(p.stdout.strip().splitlines()[0])


def run(main):
    """Runs an example's main(WORKDIR): the directory given as the first argument, else a
    temporary one removed afterwards."""
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as d:
            main(d)
