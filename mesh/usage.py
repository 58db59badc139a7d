"""Argument parsing errors as an operator wants them: one line saying what was wrong,
then the usage line of the command that was typed (not the whole option list)."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn, Sequence


class Parser(argparse.ArgumentParser):
    """An `ArgumentParser` whose errors are two lines (its subparsers are too)."""

    def leaf(self, parser: "Parser") -> None:
        """Mark `parser` (a subcommand's) as the one whose usage an error shows when the
        line ends with arguments nobody took (argparse reports those at the top)."""
        parser.set_defaults(_usage_parser=parser)

    def parse(self, argv: Sequence[str]) -> argparse.Namespace:
        args, extras = self.parse_known_args(argv)
        target: Parser = getattr(args, "_usage_parser", self)
        if extras:
            target.error(f"unrecognized arguments: {' '.join(extras)}")
        if hasattr(args, "_usage_parser"):
            del args._usage_parser
        return args

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: {message}\n{self.usage_line()}\n")
        raise SystemExit(2)

    def usage_line(self) -> str:
        """The usage on one line, however wide (argparse wraps at the terminal's width)."""
        formatter = argparse.HelpFormatter(self.prog, width=1 << 16)
        formatter.add_usage(self.usage, self._actions, self._mutually_exclusive_groups)
        return " ".join(formatter.format_help().split())
