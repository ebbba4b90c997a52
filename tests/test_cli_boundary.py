"""The one error boundary of every command (sim.infra.cli.run_cli): expected failures are one line and exit 2,
a bug shows its traceback and says it is a bug (exit 1)."""
import errno
import json

import pytest

from sim.infra.cli import describe_os_error, run_cli
from sim.infra.errors import ConfigError, TraceError


def _run(capsys, exc=None, code=0):
    def main(argv):
        if exc is not None:
            raise exc
        return code

    with pytest.raises(SystemExit) as e:
        run_cli(main, [])
    err = capsys.readouterr().err
    return e.value.code, err


def _deep_json():
    return json.loads("[" * 100000 + "]" * 100000)


@pytest.mark.parametrize("exc, needle", [
    (ConfigError("unknown policy 'x'"), "unknown policy"),
    (TraceError("bad value", file="t.jsonl", line=3, field="prompt"), "t.jsonl:3: field 'prompt'"),
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "in.jsonl"), "file not found: in.jsonl"),
    (PermissionError(errno.EACCES, "Permission denied", "out/summary.json"), "permission denied: out/summary.json"),
    (IsADirectoryError(errno.EISDIR, "Is a directory", "out"), "is a directory: out"),
    (NotADirectoryError(errno.ENOTDIR, "Not a directory", "file/x"), "not a directory: file/x"),
    (OSError(errno.ENOSPC, "No space left on device", "out/steps.csv"), "no space left on device: out/steps.csv"),
    (OSError(errno.EROFS, "Read-only file system", "/ro/x", ), "read-only file system: /ro/x"),
    (MemoryError(), "out of memory"),
    (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), "not valid text"),
])
def test_expected_failures_are_one_line_exit_2(capsys, exc, needle):
    code, err = _run(capsys, exc)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err
    assert "Traceback" not in err


def test_deep_nesting_is_one_line(capsys):
    def main(argv):
        _deep_json()

    with pytest.raises(SystemExit) as e:
        run_cli(main, [])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "nested too deeply" in err


def test_a_bug_shows_its_traceback_and_says_so(capsys):
    code, err = _run(capsys, ZeroDivisionError("division by zero"))
    assert code == 1
    assert "Traceback" in err and "ZeroDivisionError" in err
    assert err.strip().splitlines()[-1].startswith("error: internal error (ZeroDivisionError): this is a bug")


def test_success_and_interrupt(capsys):
    assert _run(capsys, None, 0)[0] == 0
    assert _run(capsys, None, 3)[0] == 3
    code, err = _run(capsys, KeyboardInterrupt())
    assert code == 130 and err.strip() == "interrupted"


def test_describe_os_error_without_a_path():
    assert describe_os_error(OSError(errno.ENOSPC, "No space left on device")).startswith("no space left on device")
