"""Errors caused by user input. The CLI prints them as one line (no traceback) and exits 2."""


class UserError(Exception):
    """Bad input: the message names the cause and the fix."""

    # Raised while TensorFlow traces a tf.function (fit's step, a custom loop), AutoGraph would rewrite the message
    # to "in user code: File ..., line ...: UserError: ..." over several lines; with this it passes the error as is.
    ag_pass_through = True
