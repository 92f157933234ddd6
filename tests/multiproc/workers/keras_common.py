"""Shared start of the Keras test workers: the --out and --mode arguments.

The worker then selects --mode's Keras as a training script does, before
``hk.init`` (which reads the backend)::

    args = parse_args(p)
    import hvdkit.keras as hk
    keras = hk.use_backend(args.mode)
"""

import argparse
import logging


def parse_args(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """Adds --out and --mode (a Keras mode: tensorflow, torch or tf_keras) to ``parser`` and parses."""
    parser.add_argument("--out", required=True)
    parser.add_argument("--mode", choices=["tensorflow", "torch", "tf_keras"], required=True)
    return parser.parse_args()


def record_hvdkit_lines() -> list[str]:
    """Every message hvdkit.keras logs from now on, in a list the worker writes into its result."""
    messages = []

    class Record(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    logging.getLogger("hvdkit.keras").addHandler(Record())
    return messages
