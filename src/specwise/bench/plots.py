"""PNG plots of a bench report: speedup vs k, acceptance by draft position, time split per
round, goodput vs temperature, speedup and acceptance by request in run order. Draws only what the report computed; no figures are made here."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

__all__ = ["write_plots"]


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _spec_parts(spec: str) -> tuple[str, int | None]:
    name, _, k = spec.partition(" k=")
    return name, int(k) if k else None


def _first_sampling(by_s: dict) -> str:
    return "T=0" if "T=0" in by_s else next(iter(by_s))


def speedup_vs_k(figures: dict, path: Path) -> None:
    cats = [c for c in figures if c != "all"] + ["all"]
    cols = 3
    rows = (len(cats) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, cat in zip(axes.flat, cats, strict=False):
        by_s = figures[cat]
        sampling = _first_sampling(by_s)
        lines: dict[str, list[tuple[int, float]]] = {}
        for spec, f in by_s[sampling].items():
            name, k = _spec_parts(spec)
            if k is not None and f["speedup_total"] is not None:
                lines.setdefault(name, []).append((k, f["speedup_total"]))
        for name, pts in sorted(lines.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        auto = by_s[sampling].get("auto")
        if auto and auto["speedup_total"] is not None:
            ax.axhline(auto["speedup_total"], color="tab:green", ls="--", label="auto")
        ax.axhline(1.0, color="black", lw=0.8, label="plain")
        ax.set_title(f"{cat} · {sampling}", fontsize=9)
        ax.set_xlabel("k (draft tokens per round)")
        ax.set_ylabel("speedup over plain")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(cats) :]:
        ax.axis("off")
    _save(fig, path)


def acceptance_by_position(figures: dict, path: Path) -> None:
    specs = {}
    for cat, by_s in figures.items():
        if cat == "all":
            continue
        for spec in by_s[_first_sampling(by_s)]:
            name, k = _spec_parts(spec)
            if k is not None and (name not in specs or k > specs[name]):
                specs[name] = k
    fig, axes = plt.subplots(
        1, max(len(specs), 1), figsize=(5 * max(len(specs), 1), 3.6), squeeze=False
    )
    for ax, (name, k) in zip(axes.flat, sorted(specs.items()), strict=False):
        for cat, by_s in figures.items():
            f = by_s[_first_sampling(by_s)].get(f"{name} k={k}")
            if f and f["acceptance_per_position"]:
                acc = f["acceptance_per_position"]
                ax.plot(
                    range(1, len(acc) + 1),
                    acc,
                    marker=".",
                    label=cat,
                    lw=2.5 if cat == "all" else 1,
                )
        ax.set_title(f"{name} k={k}: unconditional acceptance by position", fontsize=9)
        ax.set_xlabel("draft position")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=6)
    _save(fig, path)


def time_split(figures: dict, path: Path) -> None:
    by_s = figures["all"]
    sampling = _first_sampling(by_s)
    specs = list(by_s[sampling])
    parts = ("draft_ms_per_round", "verify_ms_per_round", "overhead_ms_per_round")
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(specs)), 3.8))
    bottom = [0.0] * len(specs)
    for part in parts:
        vals = [by_s[sampling][s][part] or 0.0 for s in specs]
        ax.bar(specs, vals, bottom=bottom, label=part.replace("_ms_per_round", ""))
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_ylabel("ms per round")
    ax.set_title(f"time split per round, all categories · {sampling}", fontsize=9)
    ax.tick_params(axis="x", rotation=45, labelsize=7)
    ax.legend(fontsize=7)
    _save(fig, path)


def goodput_vs_temperature(figures: dict, path: Path) -> None:
    by_s = figures["all"]
    series: dict[str, list[tuple[float, float]]] = {}
    for sampling, by_spec in by_s.items():
        t = float(sampling.split()[0][2:])
        for spec, f in by_spec.items():
            if f["goodput_tokens_per_ms"] is not None:
                series.setdefault(spec, []).append((t, f["goodput_tokens_per_ms"]))
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for spec, pts in sorted(series.items()):
        pts.sort()
        ax.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            marker="o",
            label=spec,
            lw=2.5 if spec in ("plain", "auto") else 1,
        )
    ax.set_xlabel("temperature")
    ax.set_ylabel("goodput (tokens/ms)")
    ax.set_title("goodput vs temperature, all categories", fontsize=9)
    ax.legend(fontsize=6)
    _save(fig, path)


def by_request(requests: dict, path: Path) -> None:
    """Speedup over plain and acceptance rate of each configuration against the request's
    place in the run: where a drafter learns from earlier requests, its line rises."""
    samplings = list(requests)
    fig, axes = plt.subplots(len(samplings), 2, figsize=(10, 3.2 * len(samplings)), squeeze=False)
    for (ax_s, ax_a), sampling in zip(axes, samplings, strict=True):
        for spec, rows in sorted(requests[sampling].items()):
            x = [r["index"] + 1 for r in rows]
            ax_s.plot(x, [r["speedup"] for r in rows], marker="o", ms=3, label=spec)
            acc = [(i, r["acceptance_rate"]) for i, r in zip(x, rows, strict=True)]
            acc = [(i, a) for i, a in acc if a is not None]
            ax_a.plot([i for i, _ in acc], [a for _, a in acc], marker="o", ms=3, label=spec)
        ax_s.axhline(1.0, color="black", lw=0.8)
        ax_s.set_ylabel("speedup over plain")
        ax_a.set_ylabel("acceptance rate")
        for ax in (ax_s, ax_a):
            ax.set_xlabel("request (order run)")
            ax.set_title(sampling, fontsize=9)
            ax.legend(fontsize=6)
    _save(fig, path)


def write_plots(figures: dict, folder: Path, requests: dict | None = None) -> list[Path]:
    out = []
    for name, fn in (
        ("speedup_vs_k.png", speedup_vs_k),
        ("acceptance_by_position.png", acceptance_by_position),
        ("time_split.png", time_split),
        ("goodput_vs_temperature.png", goodput_vs_temperature),
    ):
        fn(figures, folder / name)
        out.append(folder / name)
    if requests:
        by_request(requests, folder / "by_request.png")
        out.append(folder / "by_request.png")
    return out
