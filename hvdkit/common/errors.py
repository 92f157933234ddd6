"""Errors caused by user input. The CLI prints them as one line (no traceback) and exits 2."""


class UserError(Exception):
    """Bad input: the message names the cause and the fix."""
