"""`meshd passwd FILE USER`: add, update or delete an entry in a password file.

    meshd passwd /etc/meshd/passwd alice            # prompts twice
    meshd passwd /etc/meshd/passwd alice --password s3cret
    printf 's3cret\\n' | meshd passwd FILE alice --password-stdin
    meshd passwd /etc/meshd/passwd alice --delete

The file is rewritten atomically (a temporary file in the same directory, fsynced,
renamed over the old one), so a node reading it meanwhile sees the old or the new
file, never half of one; it is created and left with mode 0600. Other lines (other
users, comments, even lines the node would skip) are kept as they are.

Exit status: 0 done, 1 failed (I/O, no such user, passwords differ), 2 bad usage.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
import tempfile
from typing import Callable, NoReturn, TextIO

from mesh.auth import DEFAULT_PARAMS, ScryptParams, hash_password, validate_username

__all__ = ["main", "set_password", "delete_user", "PasswdError"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
FILE_MODE = 0o600


class PasswdError(Exception):
    """A failure to report as `meshd passwd: <message>` with exit status 1."""


def _read_lines(path: str) -> list[str]:
    try:
        with open(path, "r", encoding="utf-8") as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []
    except UnicodeDecodeError:
        raise PasswdError(f"{path}: not a UTF-8 text file; refusing to rewrite it") from None
    except OSError as e:
        raise PasswdError(f"{path}: cannot read ({e.strerror or e})") from None


def _entry_user(line: str) -> str | None:
    stripped = line.strip()
    if not stripped or stripped.startswith("#") or ":" not in stripped:
        return None
    return stripped.partition(":")[0]


def _write_atomically(path: str, lines: list[str]) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise PasswdError(f"{path}: directory {directory} does not exist")
    text = "".join(line + "\n" for line in lines)
    try:
        fd, tmp = tempfile.mkstemp(prefix=".meshd-passwd-", dir=directory)
    except OSError as e:
        raise PasswdError(f"{path}: cannot create a file in {directory} ({e.strerror or e})") from None
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise PasswdError(f"{path}: cannot write ({e.strerror or e})") from None
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # make the rename itself durable
        finally:
            os.close(dir_fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the file is written


def set_password(path: str, user: str, password: str, params: ScryptParams = DEFAULT_PARAMS) -> bool:
    """Add or update `user`; True if the user was new. Raises PasswdError or ValueError."""
    validate_username(user)
    if not password:
        raise ValueError("the password is empty")
    encoded = hash_password(password, params)
    lines = _read_lines(path)
    new_line = f"{user}:{encoded}"
    out: list[str] = []
    found = False
    for line in lines:
        if _entry_user(line) == user:
            if not found:
                out.append(new_line)  # keep the user's place in the file
            found = True  # later duplicates go: the file ends with one entry per user
            continue
        out.append(line)
    if not found:
        out.append(new_line)
    _write_atomically(path, out)
    return not found


def delete_user(path: str, user: str) -> None:
    """Remove `user`; PasswdError if the file or the user does not exist."""
    if not os.path.exists(path):
        raise PasswdError(f"{path}: no such file")
    lines = _read_lines(path)
    out = [line for line in lines if _entry_user(line) != user]
    if len(out) == len(lines):
        raise PasswdError(f"{path}: no user {user!r}")
    _write_atomically(path, out)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(message)


class _UsageError(Exception):
    pass


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="meshd passwd",
        description="Add, update or delete a user in a meshd password file (scrypt hashes, mode 0600).",
        epilog="Without --password or --password-stdin the password is prompted for twice. "
        "Note that --password is visible to other users in the process list.",
    )
    parser.add_argument("file", metavar="FILE", help="the password file (created if missing)")
    parser.add_argument("user", metavar="USER", help="the user name")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--password", metavar="PASSWORD", help="the new password")
    how.add_argument("--password-stdin", action="store_true", help="read the new password from the first line of stdin")
    how.add_argument("--delete", action="store_true", help="remove USER from FILE")
    return parser


def _prompt(getpass_fn: Callable[[str], str]) -> str:
    first = getpass_fn("Password: ")
    second = getpass_fn("Reenter password: ")
    if first != second:
        raise PasswdError("the passwords do not match")
    return first


def main(
    argv: list[str],
    *,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    getpass_fn: Callable[[str], str] = getpass.getpass,
    params: ScryptParams = DEFAULT_PARAMS,
) -> int:
    """Run `meshd passwd` with `argv` (the words after `passwd`); returns the exit status."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except _UsageError as e:
        print(parser.format_usage().rstrip(), file=stderr)
        print(f"meshd passwd: {e}", file=stderr)
        return EXIT_USAGE
    except SystemExit as e:  # --help
        return int(e.code or 0)
    try:
        validate_username(args.user)
    except ValueError as e:
        print(f"meshd passwd: {e}", file=stderr)
        return EXIT_USAGE
    try:
        if args.delete:
            delete_user(args.file, args.user)
            print(f"deleted user {args.user!r} from {args.file}", file=stdout)
            return EXIT_OK
        if args.password is not None:
            password = args.password
        elif args.password_stdin:
            password = stdin.readline().rstrip("\r\n")
        else:
            password = _prompt(getpass_fn)
        if not password:
            raise PasswdError("the password is empty")
        created = set_password(args.file, args.user, password, params)
    except (PasswdError, ValueError) as e:
        print(f"meshd passwd: {e}", file=stderr)
        return EXIT_FAILED
    except (KeyboardInterrupt, EOFError):
        print("\nmeshd passwd: cancelled; nothing changed", file=stderr)
        return EXIT_FAILED
    print(f"{'added' if created else 'updated'} user {args.user!r} in {args.file}", file=stdout)
    return EXIT_OK
