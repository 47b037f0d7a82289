"""Calibration of predicted acceptance probabilities: ECE, Brier score, AUROC and a reliability plot.

- ECE (expected calibration error; Naeini et al., "Obtaining Well Calibrated Probabilities Using Bayesian Binning",
  2015; Guo et al., "On Calibration of Modern Neural Networks", 2017): predictions cut into ``bins`` equal-width bins
  on [0, 1] (bin b holds b/bins <= p < (b+1)/bins, p = 1 in the last), ECE = sum_b n_b / N * |mean(y_b) - mean(p_b)|.
- Brier score (Brier, 1950): mean((p - y)^2).
- AUROC: the probability that an accepted draft gets a higher prediction than a rejected one (ties count half;
  Mann-Whitney U / (n_pos n_neg)), which says how well a threshold on p separates them, apart from calibration.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np


def bin_stats(p: np.ndarray, y: np.ndarray, bins: int = 10) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per equal-width bin: count [bins] int, mean prediction [bins], observed frequency [bins] (NaN when empty)."""
    p, y = np.asarray(p, dtype=np.float64), np.asarray(y, dtype=np.float64)
    idx = np.clip((p * bins).astype(np.int64), 0, bins - 1)
    count = np.bincount(idx, minlength=bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_p = np.bincount(idx, weights=p, minlength=bins) / count
        freq = np.bincount(idx, weights=y, minlength=bins) / count
    return count, mean_p, freq


def ece(p: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    """Expected calibration error over ``bins`` equal-width bins (module docstring); 0.0 for no samples."""
    count, mean_p, freq = bin_stats(p, y, bins)
    n = count.sum()
    if n == 0:
        return 0.0
    used = count > 0
    return float((count[used] / n * np.abs(freq[used] - mean_p[used])).sum())


def brier(p: np.ndarray, y: np.ndarray) -> float:
    """Mean squared error of the predictions against 0/1 outcomes; NaN for no samples."""
    p, y = np.asarray(p, dtype=np.float64), np.asarray(y, dtype=np.float64)
    return float(np.mean((p - y) ** 2)) if len(p) else float("nan")


def auroc(p: np.ndarray, y: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney, ties half); NaN when one class is absent."""
    from scipy.stats import rankdata

    p, y = np.asarray(p, dtype=np.float64), np.asarray(y).astype(bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = rankdata(p)  # average ranks for ties
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


@dataclass
class Calibration:
    """Calibration of one predictor on one sample set.

    Attributes:
        samples: predictions scored.
        acceptance_rate: share of accepted drafts (the labels' mean).
        mean_prediction: mean predicted probability.
        ece, brier, auroc: as in the module docstring.
        bins: the ECE's equal-width bins; bin_count, bin_mean_p, bin_accept: per bin (None when empty).
    """

    samples: int
    acceptance_rate: float
    mean_prediction: float
    ece: float
    brier: float
    auroc: float
    bins: int
    bin_count: list[int]
    bin_mean_p: list[float | None]
    bin_accept: list[float | None]


def calibration(p: np.ndarray, y: np.ndarray, bins: int = 10) -> Calibration:
    """Every metric of ``p`` (predicted acceptance, [N]) against ``y`` ([N] 0/1)."""
    p, y = np.asarray(p, dtype=np.float64), np.asarray(y, dtype=np.float64)
    count, mean_p, freq = bin_stats(p, y, bins)
    as_list = lambda a: [None if np.isnan(v) else float(v) for v in a]  # noqa: E731
    return Calibration(samples=len(p), acceptance_rate=float(y.mean()) if len(y) else float("nan"),
                       mean_prediction=float(p.mean()) if len(p) else float("nan"), ece=ece(p, y, bins),
                       brier=brier(p, y), auroc=auroc(p, y), bins=bins, bin_count=[int(c) for c in count],
                       bin_mean_p=as_list(mean_p), bin_accept=as_list(freq))


def compare(predictors: dict[str, np.ndarray], y: np.ndarray, step: np.ndarray, bins: int = 10) -> dict:
    """Calibration of each predictor overall and per draft step: ``{"overall": {name: {...}}, "per_step":
    [{"step": j, name: {...}}, ...]}`` (dicts of :class:`Calibration`)."""
    out = {"overall": {name: asdict(calibration(p, y, bins)) for name, p in predictors.items()}, "per_step": []}
    for j in sorted(set(int(s) for s in step)):
        sel = step == j
        out["per_step"].append({"step": j, **{name: asdict(calibration(p[sel], y[sel], bins))
                                               for name, p in predictors.items()}})
    return out


def reliability_plot(result: dict, labels: dict[str, str], path: Path, title: str) -> None:
    """Reliability diagrams of :func:`compare`'s result: overall and per draft step, observed acceptance against mean
    prediction per bin (marker area ~ samples), with the diagonal of perfect calibration; written to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("all draft steps", result["overall"])] + [(f"draft step {r['step'] + 1}", r) for r in
                                                          result["per_step"]]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.4 * len(panels), 3.6), sharey=True)
    axes = np.atleast_1d(axes)
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    for ax, (name, res) in zip(axes, panels):
        ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--")
        for color, (key, label) in zip(colors, labels.items()):
            c = res[key]
            pts = [(m, a, n) for m, a, n in zip(c["bin_mean_p"], c["bin_accept"], c["bin_count"]) if n > 0]
            if not pts:
                continue
            m, a, n = map(np.asarray, zip(*pts))
            ax.plot(m, a, color=color, lw=1, marker=None)
            ax.scatter(m, a, s=8 + 120 * n / n.max(), color=color,
                       label=f"{label} (ECE {c['ece']:.3f}, Brier {c['brier']:.3f})")
        ax.set_title(f"{name} (n={res[next(iter(labels))]['samples']})", fontsize=9)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("predicted acceptance (bin mean)", fontsize=8)
        ax.legend(fontsize=6, loc="upper left")
    axes[0].set_ylabel("observed acceptance", fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
