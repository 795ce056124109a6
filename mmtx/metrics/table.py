"""Console tables of metrics."""

from __future__ import annotations

from collections.abc import Mapping


def format_metrics_table(
    metrics: Mapping[str, float],
    baseline: Mapping[str, float] | None = None,
    baseline_name: str = "constant baseline",
) -> str:
    """An aligned plain-text table: metric, model score and (optionally) a baseline's score."""
    header = ["metric", "model"] + ([baseline_name] if baseline is not None else [])
    rows = [header]
    for name, value in metrics.items():
        row = [name, f"{value:.4f}"]
        if baseline is not None:
            row.append(f"{baseline[name]:.4f}" if name in baseline else "-")
        rows.append(row)
    widths = [max(len(row[c]) for row in rows) for c in range(len(header))]
    rows.insert(1, ["-" * w for w in widths])
    lines = ("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)
    return "\n".join(lines)
