"""What a test worker hands back: one JSON file per rank, read by tests/conftest.py read_rank_results.

Standard library only, so a Keras worker on TensorFlow need not import torch to write its result.

    write_result(args.out, ctx.rank, {"size": ctx.size})                    # <out>/rank0.json
    write_result(args.out, ctx.rank, {"epoch": 2}, prefix="preempted")      # <out>/preempted0.json
"""

import json
import os


def write_result(out_dir, rank, result, prefix="rank"):
    with open(os.path.join(out_dir, f"{prefix}{rank}.json"), "w") as f:
        json.dump(result, f)
