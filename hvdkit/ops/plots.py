"""Every picture hvdkit draws: benchmarks, the scaling study, ``hvdkit plan`` and ``hvdkit timeline``.

Each function takes plain data (result rows, the cost model's predictions, a
timeline report) and writes one PNG, whole or not at all. matplotlib is
imported only when a picture is drawn, on the Agg backend (no display).

Example::

    plot_allreduce("allreduce.png", rows, "allreduce, 2 processes")
"""

from __future__ import annotations

import io

from hvdkit.common.errors import UserError
from hvdkit.common.files import atomic_write
from hvdkit.common.units import format_bytes


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed), imported only when a plot is drawn."""
    try:
        import matplotlib
    except ImportError as exc:
        raise UserError("matplotlib is not installed, so no picture can be drawn: pip install 'hvdkit[bench]' "
                        "(hvdkit timeline also takes --plot none)") from exc

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str) -> None:
    """The figure as a PNG at ``path``, written whole or not at all; the figure is closed."""
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    pyplot().close(fig)
    data = png.getvalue()
    atomic_write(path, lambda f: f.write(data), what="plot")


def plot_allreduce(path: str, rows: list[dict], title: str) -> None:
    """Bus bandwidth vs message size per implementation, and the ResNet-50 fusion bars."""
    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    sweep = [r for r in rows if r["case"] == "sweep"]
    for impl in dict.fromkeys(r["impl"] for r in sweep):
        pts = sorted((r["bytes"], r["busbw_GBps"]) for r in sweep if r["impl"] == impl)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl, lw=2.5 if impl == "hvdkit" else 1.2)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes, float32)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    many = {r["impl"]: r["median_s"] * 1e3 for r in rows if r["case"] == "resnet50-many"}
    one = {r["impl"]: r["median_s"] * 1e3 for r in rows if r["case"] == "resnet50-one"}
    impls = [i for i in many if i in one]
    xs = range(len(impls))
    bx.bar([x - 0.2 for x in xs], [many[i] for i in impls], 0.4, label="161 tensors (ResNet-50)")
    bx.bar([x + 0.2 for x in xs], [one[i] for i in impls], 0.4, label="1 tensor, same bytes")
    bx.set_xticks(list(xs), impls, rotation=30, ha="right")
    bx.set_ylabel("ms per allreduce")
    bx.set_title("tensor fusion", fontsize=9)
    bx.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


def plot_train(path: str, rows: list[dict], title: str, phases: tuple[str, ...]) -> None:
    """Stacked time split per run (``phases``, each a ``<phase>_ms`` column), and samples/s per implementation."""
    plt = pyplot()
    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        runs = sorted((r for r in rows if r["model"] == model), key=lambda r: (r["np"], r["impl"]))
        labels = [f"{r['impl']}\nnp={r['np']}" for r in runs]
        bottom = [0.0] * len(runs)
        for phase in phases:
            values = [r[f"{phase}_ms"] for r in runs]
            ax.bar(labels, values, bottom=bottom, label=phase)
            bottom = [b + v for b, v in zip(bottom, values)]
        for x, r in enumerate(runs):
            ax.text(x, bottom[x], f"{r['samples_per_s']:.0f}/s", ha="center", va="bottom", fontsize=8)
        ax.set_ylabel("ms per step (median)")
        ax.set_title(f"{model}: {title}", fontsize=8)
        ax.legend(fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    save_figure(fig, path)


def plot_scaling(path: str, result: dict) -> None:
    """Exchange time and training step against hosts: measured points, predicted lines; ring and server."""
    plt = pyplot()
    largest = _largest_case(result["exchanges"])
    models = sorted({p["model"] for p in result["steps"]})
    fig, axes = plt.subplots(1, 1 + len(models), figsize=(5.5 * (1 + len(models)), 4.2), squeeze=False)
    styles = {"hvdkit": ("tab:blue", "o", "ring, hvdkit (launch's controller)"),
              "horovod-gloo": ("tab:cyan", "s", "ring, Horovod Gloo"),
              "mpi4py-avg": ("tab:gray", "x", "ring, raw Open MPI (mpi4py-avg)"),
              "torch": ("tab:green", "D", "ring, torch.distributed (Gloo)"),
              "ps": ("tab:red", "^", "parameter server")}
    panels = [(axes[0][0], largest, f"averaging {format_bytes(largest[0]['bytes'])}" if largest else "",
               "ms per exchange")]
    panels += [(ax, [p for p in result["steps"] if p["model"] == model], f"{model} training step", "ms per step")
               for ax, model in zip(axes[0][1:], models)]
    for ax, points, title, ylabel in panels:
        for impl, (color, marker, label) in styles.items():
            pts = sorted((p for p in points if p["impl"] == impl), key=lambda p: p["hosts"])
            if pts:
                ax.plot([p["hosts"] for p in pts], [p["measured_s"] * 1e3 for p in pts], marker, color=color,
                        label=f"{label}, measured")
        # One predicted line per scheme: the model does not tell the rings apart.
        for scheme, color, pick in (("ring", "tab:blue", lambda p: p["impl"] != "ps"),
                                    ("parameter server", "tab:red", lambda p: p["impl"] == "ps")):
            by_hosts = {p["hosts"]: p["predicted_s"] for p in points if pick(p)}
            if by_hosts:
                xs = sorted(by_hosts)
                ax.plot(xs, [by_hosts[x] * 1e3 for x in xs], "--", color=color, label=f"{scheme}, predicted")
        ax.set_title(title)
        ax.set_xlabel("hosts (one worker each)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    hosts = sorted({p["hosts"] for p in result["exchanges"] + result["steps"]})
    for ax in axes[0]:
        ax.set_xticks(hosts)
        ax.set_ylim(bottom=0)
    link = f"links shaped to {result['link_mbit']:g} Mbit/s; " if result.get("link_mbit") else ""
    fig.suptitle(f"ring vs parameter server: {link}dashed: hvdkit plan fitted on {result['calibrated_on']}, "
                 f"{result['calibration_hosts']} hosts", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)


def _largest_case(exchanges: list[dict]) -> list[dict]:
    """The points of the largest single-tensor exchange (ResNet-50's gradients when the study had them)."""
    one = [p for p in exchanges if p["case"] in ("resnet50-one", "sweep")]
    if not one:
        return []
    biggest = max(p["bytes"] for p in one)
    return [p for p in one if p["bytes"] == biggest]


def plot_cost_model(path: str, preds, assumptions: dict) -> None:
    """The cost model's scaling efficiency against workers: ring-allreduce next to one parameter server
    (``hvdkit plan --plot``)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [p.workers for p in preds]
    ax.plot(xs, [p.ring_efficiency for p in preds], marker="o", label="ring-allreduce")
    ax.plot(xs, [p.ps_efficiency for p in preds], marker="s", label="parameter server (1 server)")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("workers (GPUs)")
    ax.set_ylabel("scaling efficiency")
    ax.set_title(f"{assumptions['params'] / 1e6:.1f} M params, {assumptions['compute_ms']:.0f} ms compute, "
                 f"{assumptions['bandwidth_GBps']:.3g} GB/s, {assumptions['latency_us']:.3g} us", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)


def plot_timeline(path: str, report, title: str = "") -> None:
    """``hvdkit timeline``'s picture: per rank, how late it reports tensors ready and how long it waits,
    against the time in collectives; and the heaviest tensors (a :class:`hvdkit.ops.timeline.TimelineReport`)."""
    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [1, 1.4]})
    ranks = [f"rank {s.rank}" for s in report.ranks]
    ys = range(len(ranks))
    ax.barh([y - 0.2 for y in ys], [s.late_total_ms for s in report.ranks], height=0.4, label="others waited for it")
    ax.barh([y + 0.2 for y in ys], [s.waited_ms for s in report.ranks], height=0.4, label="it waited for others")
    ax.axvline(report.reducing_ms, color="k", linestyle="--", label=f"reducing ({report.reducing_ms:.0f} ms)")
    for y, s in zip(ys, report.ranks):
        ax.annotate(f"median {s.late_median_ms:.1f} ms late", (s.late_total_ms, y - 0.2), fontsize=8,
                    xytext=(3, -3), textcoords="offset points")
    ax.set_yticks(list(ys), ranks)
    ax.invert_yaxis()
    ax.set_xlabel("ms (wall time)")
    ax.set_title("negotiation: late and waiting, per rank", fontsize=10)
    ax.legend(fontsize=8)
    tensors = list(report.tensors)
    ty = range(len(tensors))
    bx.barh(list(ty), [t.op_ms for t in tensors], label="in the collective")
    bx.barh(list(ty), [t.negotiate_ms for t in tensors], left=[t.op_ms for t in tensors], alpha=0.5,
            label="negotiating")
    bx.set_yticks(list(ty), [t.tensor for t in tensors], fontsize=8)
    bx.invert_yaxis()
    bx.set_xlabel("ms, summed over the run")
    bx.set_title("heaviest tensors", fontsize=10)
    bx.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
