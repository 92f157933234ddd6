"""Shared start of the Keras test workers: pick the backend before Keras is imported."""

import argparse
import os


def parse_args_and_select_backend(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """Adds --out and --mode, parses, and sets KERAS_BACKEND / TF_USE_LEGACY_KERAS for --mode."""
    parser.add_argument("--out", required=True)
    parser.add_argument("--mode", choices=["tensorflow", "torch", "tf_keras"], required=True)
    args = parser.parse_args()
    if args.mode == "tf_keras":
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    else:
        os.environ["KERAS_BACKEND"] = args.mode
    return args


def keras_for(mode: str):
    if mode == "tf_keras":
        import tf_keras as keras
    else:
        import keras
    return keras
