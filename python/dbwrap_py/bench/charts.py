"""PNG charts of the SMB sweep and the memory figures (matplotlib, no display).

Like the seed talks' charts: opens/s against the number of clients and
average open latency against the number of clients, clients on a log scale,
one line per backend, native tdb drawn as the reference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

NATIVE = "native"
NATIVE_LABEL = "native tdb (reference)"


def series(rows: Sequence[Mapping], metric: str) -> dict[str, list[tuple[int, float]]]:
    """backend -> [(nprocs, value)] sorted by nprocs; rows with no sample are left out."""
    lines: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        if row.get("samples", 1) and row[metric] > 0:
            lines.setdefault(row["backend"], []).append((row["nprocs"], float(row[metric])))
    return {label: sorted(points) for label, points in lines.items()}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server
    import matplotlib.pyplot as plt

    return plt


def line_chart(lines: Mapping[str, Sequence[tuple[int, float]]], path: Path, title: str,
               ylabel: str, log_y: bool = False, reference: str = NATIVE,
               reference_label: str = NATIVE_LABEL, note: str = "",
               names: Mapping[str, str] | None = None) -> Path:
    """One line per backend against clients (log 2 scale); the reference
    (native tdb) dashed black; ``note`` in small print under the axes;
    ``names`` relabels lines in the legend."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.6 if note else 5), dpi=110)
    for label, points in lines.items():
        xs, ys = zip(*points)
        if label == reference:
            ax.plot(xs, ys, "k--", marker="s", linewidth=2, label=reference_label)
        else:
            ax.plot(xs, ys, marker="o", linewidth=1.8, label=(names or {}).get(label, label))
    ticks = sorted({x for points in lines.values() for x, _ in points})
    ax.set_xscale("log", base=2)
    if ticks:
        ax.set_xticks(ticks, [str(t) for t in ticks])
    if log_y:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    ax.set_xlabel("clients (smbtorture nprocs)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.4)
    ax.legend(fontsize="small")
    return _save(fig, path, note, 0.08)


def cluster_charts(rows: Sequence[Mapping], stem: Path, nodes: int, reference: str, subtitle: str,
                   note: str, names: Mapping[str, str] | None = None) -> list[Path]:
    """<stem>-ops.png and <stem>-latency.png of a cluster sweep, titled as
    the seed talks' charts, ``subtitle`` under the title; ``reference``
    (ctdb) dashed black."""
    title = f"Samba cluster, n={nodes}, non-concurrent opens"
    common = {"reference": reference, "reference_label": f"{reference} (reference)", "note": note,
              "names": names, "log_y": True}
    return [
        line_chart(series(rows, "opens_per_second"), stem.with_name(stem.name + "-ops.png"),
                   f"{title}\n{subtitle}", "opens/s (higher is better)", **common),
        line_chart(series(rows, "open_latency_ms"), stem.with_name(stem.name + "-latency.png"),
                   f"{title}, latency\n{subtitle}", "average open latency, ms (lower is better)", **common),
    ]


def sweep_charts(rows: Sequence[Mapping], stem: Path, seconds: int) -> list[Path]:
    """<stem>-ops.png and <stem>-latency.png for a sweep summary."""
    where = f"smb2.bench.path-contention-shared, {seconds} s per point"
    return [
        line_chart(series(rows, "opens_per_second"), stem.with_name(stem.name + "-ops.png"),
                   f"Opens per second against clients\n{where}", "opens/s (higher is better)",
                   log_y=True),
        line_chart(series(rows, "open_latency_ms"), stem.with_name(stem.name + "-latency.png"),
                   f"Average open latency against clients\n{where}",
                   "average open latency, ms (lower is better)", log_y=True),
    ]


def memory_chart(rows: Sequence[Mapping], path: Path) -> Path:
    """Mean PSS per smbd client process: a group of bars per connection count."""
    plt = _pyplot()
    counts = sorted({r["connections"] for r in rows})
    labels = list(dict.fromkeys(r["backend"] for r in rows))
    by_key = {(r["backend"], r["connections"]): r["pss_kib_mean"] / 1024 for r in rows}
    width = 0.8 / max(len(labels), 1)
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for i, label in enumerate(labels):
        xs = [c + (i - (len(labels) - 1) / 2) * width for c in range(len(counts))]
        ys = [by_key.get((label, n), 0.0) for n in counts]
        ax.bar(xs, ys, width, label=NATIVE_LABEL if label == NATIVE else label,
               color="black" if label == NATIVE else None)
    ax.set_xticks(range(len(counts)), [str(n) for n in counts])
    ax.set_xlabel("open connections")
    ax.set_ylabel("PSS per smbd client process, MiB")
    ax.set_title("Memory of one smbd client process (proportional set size)")
    ax.grid(True, axis="y", alpha=0.4)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    _pyplot().close(fig)
    return path


def timeline_chart(panels: Mapping[str, Mapping[str, Sequence[tuple[float, float]]]], path: Path,
                   at: float, title: str, note: str = "", bins: str = "1 s") -> Path:
    """A panel per title in ``panels``, side by side: a line per label of
    (seconds, value) points, a dotted line at ``at`` (the event); the first
    label (the reference, ctdb) dashed black. ``bins``: their width, for the axis."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(5 * max(len(panels), 1), 4.6), dpi=110,
                             sharey=True, squeeze=False)
    for ax, (name, lines) in zip(axes[0], panels.items()):
        for i, (label, points) in enumerate(lines.items()):
            if not points:
                continue
            xs, ys = zip(*points)
            style = {"color": "black", "linestyle": "--"} if i == 0 else {}
            ax.plot(xs, ys, marker=".", linewidth=1.6, label=label, **style)
        ax.axvline(at, color="grey", linestyle=":", linewidth=1.5)
        ax.set_title(name, fontsize="medium")
        ax.set_xlabel("seconds since the clients started")
        ax.grid(True, alpha=0.4)
        ax.legend(fontsize="small")
    top = max((y for lines in panels.values() for points in lines.values() for _, y in points), default=0)
    axes[0][0].set_ylim(0, top * 1.05 or 1)  # shared by every panel: the highest second shows
    axes[0][0].set_ylabel(f"opens/s ({bins} bins)")
    fig.suptitle(title)
    return _save(fig, path, note, 0.07)


def _save(fig, path: Path, note: str, note_height: float) -> Path:
    """The figure at ``path``, with ``note`` in small italics below it (the
    bottom ``note_height`` of the figure), and closed."""
    if note:
        fig.text(0.01, 0.01, note, fontsize=7.5, style="italic", wrap=True)
        fig.tight_layout(rect=(0, note_height, 1, 1))
    else:
        fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    _pyplot().close(fig)
    return path
