"""Helpers of the command-line tests: run ``main`` in this process and check a usage error."""

import subprocess


def assert_usage_error(proc, *fragments):
    """Exit status 2 and ONE line on stderr that names each fragment, no traceback."""
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("invariant-cluster")
    for f in fragments:
        assert f in lines[0], lines[0]


def call(capsys, *args):
    """``main(args)`` in this process (no interpreter start-up): ``(status, stdout, stderr)``."""
    from invariant_cluster.cli import main

    capsys.readouterr()
    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:  # argparse's errors and --help
        code = exc.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)
