"""Shared figure style and byte-stable saving for every hybridlab figure.

Definitions:
- One seaborn theme (`whitegrid`, `paper` context, colour-blind palette) applied through an explicit
  rc dict, so figures never depend on a user's matplotlibrc or on what ran before in the process.
- Figures are plain `matplotlib.figure.Figure` objects on the Agg canvas (no pyplot global state, no
  display needed on a cluster node), with a fixed size in inches and a fixed DPI.
- Byte-stable saving: PNG without the `Software` chunk, PDF without `CreationDate`/`Producer`/`Creator`,
  SVG ids from a fixed `svg.hashsalt`. Two renders of the same tables give identical bytes, so DVC
  caches and Snakemake checksums stay valid (README, "Sharing results with DVC").
Files are written to a temporary name and renamed, so a killed job never leaves a half-written figure.
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from hybridlab.atomic import atomic_file
from hybridlab.errors import HybridlabError

if TYPE_CHECKING:
    from matplotlib.figure import Figure


class LazyModule:
    """A module imported on its first attribute access, with matplotlib on the Agg backend first.

    The Snakefile reads the figure registry (this package) at every parse; only drawing needs matplotlib and
    seaborn, which take longer to import than the rest of the parse.
    """

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        import matplotlib

        matplotlib.use("Agg")  # headless and deterministic; must precede any pyplot import (seaborn's)
        return getattr(importlib.import_module(self._name), attr)


mpl = LazyModule("matplotlib")
sns = LazyModule("seaborn")
_mpl_figure = LazyModule("matplotlib.figure")

DPI = 150
PANEL_W, PANEL_H = 3.2, 2.6  # inches per panel; figures are whole multiples so layouts are stable
MAX_COLS = 4
PALETTE = "colorblind"
ROLE_COLORS = {"hybrid": "#0173b2", "dense": "#de8f05"}
FA_COLOR = "#1f3b73"

PNG_METADATA = {"Software": None}
PDF_METADATA = {"CreationDate": None, "Producer": None, "Creator": None}
SVG_METADATA = {"Date": None, "Creator": None}

_RC = {
    "svg.hashsalt": "hybridlab",
    "pdf.fonttype": 42,  # embedded TrueType: text stays selectable and editable in the paper PDF
    "font.family": "DejaVu Sans",  # ships with matplotlib: the same glyphs on every machine
    "figure.dpi": DPI,
    "savefig.dpi": DPI,
    "savefig.bbox": None,  # tight bbox would make the canvas size depend on label lengths
    "axes.titlesize": 9,
    "axes.labelsize": 8,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "legend.fontsize": 7,
    "legend.title_fontsize": 7,
    "lines.linewidth": 1.2,
    "lines.markersize": 3.5,
}


def rc() -> dict:
    """The complete rc dict: seaborn's whitegrid/paper theme plus the project's fixed settings."""
    rc_dict = {**sns.axes_style("whitegrid"), **sns.plotting_context("paper"), **_RC}
    rc_dict["axes.prop_cycle"] = mpl.cycler(color=sns.color_palette(PALETTE))
    return rc_dict


@contextmanager
def themed():
    """Apply the project style for the duration of a figure's construction (rc is restored after)."""
    with mpl.rc_context(rc()):
        yield


def new_figure(n_panels: int = 1, ncols: int | None = None, *, sharex=False, sharey=False,
               width: float | None = None, height: float | None = None):
    """A Figure with a grid of `n_panels` Axes (row-major, at most MAX_COLS per row); extra cells hidden.

    Returns (fig, axes) with axes a flat list of length n_panels. Must be called inside `themed()`.
    """
    if n_panels < 1:
        raise HybridlabError("a figure needs at least one panel; the input table selected no data")
    ncols = ncols or min(n_panels, MAX_COLS)
    nrows = -(-n_panels // ncols)
    fig = _mpl_figure.Figure(figsize=(width or PANEL_W * ncols, height or PANEL_H * nrows), dpi=DPI,
                 layout="constrained")
    grid = fig.subplots(nrows, ncols, squeeze=False, sharex=sharex, sharey=sharey)
    flat = [ax for row in grid for ax in row]
    for ax in flat[n_panels:]:
        ax.set_visible(False)
    return fig, flat[:n_panels]


def freeze_layout(fig: Figure) -> None:
    """Run the constrained layout once and then fix it: it iterates from the previous positions, so each
    further save would move the axes a little and two files of one figure would disagree."""
    if fig.get_layout_engine() is not None:
        with mpl.rc_context(rc()):
            fig.draw_without_rendering()
        fig.set_layout_engine("none")


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Save `fig` byte-stably; the format comes from the suffix (.png, .pdf or .svg)."""
    path = Path(path)
    freeze_layout(fig)
    fmt = path.suffix.lower().lstrip(".")
    metadata = {"png": PNG_METADATA, "pdf": PDF_METADATA, "svg": SVG_METADATA}.get(fmt)
    if metadata is None:
        raise HybridlabError(f"cannot save a figure as '{path.name}': use a .png, .pdf or .svg file name")
    with mpl.rc_context(rc()):
        with atomic_file(path) as tmp:
            fig.savefig(tmp, format=fmt, dpi=DPI, metadata=dict(metadata))
    return path


def save_all(fig: Figure, *paths: str | Path) -> list[Path]:
    """Save one figure to several files (e.g. the PNG and the PDF of a rule)."""
    return [save_figure(fig, p) for p in paths]
