"""Figures for the page on sequence and context parallelism (chapter 3, page 7).

Each returns a matplotlib figure with a title and labelled axes; pages display
it with :func:`lessonlib.book.plots.show` and alt text.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch, Polygon

from ..calc.sequence import LAYOUTS, causal_block_counts, sequence_layout
from ..checks import count as check_count, mapping as check_mapping, reads as _reads, sequence as check_sequence

#: The most devices the grids draw (2 * devices chunks a side).
MAX_GRID_DEVICES = 16


@_reads("measured")
def plot_causal_work(world_size: int, measured: dict):
    """Which chunk pairs each device computes under a causal mask, contiguous and zig-zag, and the counts.

    Left and middle: the ``2*world_size x 2*world_size`` grid of (query chunk, key
    chunk) pairs of :func:`lessonlib.calc.sequence.sequence_layout`, each
    computed pair coloured by the device that holds the query chunk, the
    skipped ones (keys after every query) blank; each computed pair is a
    whole cell, and on the diagonal the half the causal mask hides is hatched. Right: ``measured``, the
    blocks each process computed in a run (``{"contiguous": [...],
    "zigzag": [...]}``, one count per process), as bars.
    """
    world_size = check_count("world_size", world_size, minimum=2, maximum=MAX_GRID_DEVICES)
    measured = check_mapping("measured", measured)
    counts = {}
    for name in LAYOUTS:
        if name not in measured:
            raise ValueError(f"measured must have a {name!r} entry: the blocks per process of that layout")
        counts[name] = [check_count(f"measured[{name!r}][{i}]", c, minimum=0)
                        for i, c in enumerate(check_sequence(f"measured[{name!r}]", measured[name]))]
    if len(counts["contiguous"]) != len(counts["zigzag"]):
        raise ValueError("measured's two layouts must list the same processes")
    cmap = plt.get_cmap("tab10")
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.9), gridspec_kw={"width_ratios": [1, 1, 1.15]})
    n = 2 * world_size
    for ax, name in zip(axes[:2], LAYOUTS):
        owner = {c: r for r, chunks in enumerate(sequence_layout(world_size, name)) for c in chunks}
        grid = [[owner[q] if k <= q else float("nan") for k in range(n)] for q in range(n)]
        ax.imshow(grid, cmap=ListedColormap([cmap(r % 10) for r in range(world_size)]), vmin=-0.5,
                  vmax=world_size - 0.5, origin="upper")
        per = causal_block_counts(world_size, name)
        ax.set(title=f"{name}: blocks per device {per}" if world_size <= 4 else f"{name}: {min(per)} to {max(per)} "
                     "blocks a device", xlabel="key chunk (position in the sequence)",
               ylabel="query chunk (colour: device holding it)")
        ax.title.set_fontsize(9)
        ax.set_xticks(range(n))
        ax.set_yticks(range(n))
        # whole cells with gridlines: each computed block counts as one, the diagonal ones too
        ax.set_xticks([i - 0.5 for i in range(n + 1)], minor=True)
        ax.set_yticks([i - 0.5 for i in range(n + 1)], minor=True)
        ax.grid(which="minor", color="white", linewidth=1.2)
        ax.tick_params(which="minor", length=0)
        for q in range(n):  # inside a diagonal block the mask hides the keys after each query: hatch that half
            ax.add_patch(Polygon([(q - 0.5, q - 0.5), (q + 0.5, q - 0.5), (q + 0.5, q + 0.5)], closed=True,
                                 facecolor="white", edgecolor="#555555", hatch="///", linewidth=0.6))
    masked = Patch(facecolor="white", edgecolor="#555555", hatch="///", label="masked half")
    axes[0].legend(handles=[Patch(color=cmap(r % 10), label=f"device {r}") for r in range(min(world_size, 8))]
                   + [masked], loc="upper right", fontsize=8, title="holds the queries", title_fontsize=8)
    ax = axes[2]
    ranks = range(len(counts["zigzag"]))
    for off, name, colour, hatch in ((-0.2, "contiguous", "#9a9a9a", ""), (0.2, "zigzag", "#3a3a3a", "..")):
        ax.bar([r + off for r in ranks], counts[name], width=0.4, label=name, color=colour, hatch=hatch,
               edgecolor="white")
    ax.set(title=f"Measured: blocks each of {len(ranks)} processes computed", xlabel="process (rank)",
           ylabel="chunk pairs computed (blocks)")
    ax.title.set_fontsize(9)
    ax.set_xticks(list(ranks))
    ax.legend(fontsize=8)
    drawn = (f"on {world_size} processes" if world_size == len(ranks) else
             f"grids drawn for {world_size} devices, bars measured on {len(ranks)} processes")
    fig.suptitle(f"Causal attention's work per device, contiguous split against zig-zag, {drawn}", fontsize=10)
    fig.tight_layout()
    return fig
