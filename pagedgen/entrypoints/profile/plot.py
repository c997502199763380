from pagedgen.entrypoints.profile.profiler import ProfileReport

PLOT_INSTALL = "pip install 'pagedgen[plot]'"


def plot_report(report: ProfileReport, path: str) -> None:
    """Saves a PNG: pool usage and live tokens over the run, and the block-size comparison."""
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError(f"--plot needs matplotlib: {PLOT_INSTALL}") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (timeline, sizes) = plt.subplots(2, 1, figsize=(10, 8))
    pool = report.pool_tokens
    steps = range(len(report.timeline))
    block_size = report.block_size
    timeline.plot(
        steps,
        [100 * u / report.num_blocks for u, _, _ in report.timeline],
        label="pool usage (blocks in use)",
    )
    timeline.plot(
        steps,
        [100 * h * block_size / pool for _, h, _ in report.timeline],
        label="slots in block tables (a shared block once per table)",
    )
    timeline.plot(
        steps,
        [100 * lv / pool for _, _, lv in report.timeline],
        label="live tokens (shared ones once per sequence)",
    )
    timeline.set(
        xlabel="step",
        ylabel="% of the pool's token slots",
        title=f"{report.model}: {report.mode}, block size {block_size}, {report.num_blocks} blocks",
    )
    timeline.set_ylim(bottom=0)
    timeline.legend(loc="lower left", fontsize=8)

    rows = report.block_sizes
    labels = [str(row["block_size"]) for row in rows]
    x = range(len(rows))
    width = 0.4
    sizes.bar(
        [i - width / 2 for i in x],
        [100 * r["live_token_utilization"] for r in rows],
        width,
        label="live-token utilization",
    )
    sizes.bar(
        [i + width / 2 for i in x],
        [100 * r["mean_pool_usage"] for r in rows],
        width,
        label="mean pool usage",
    )
    for row in report.run["contiguous"][1:]:
        sizes.axhline(100 * row["live_token_utilization"], linestyle="--", color="gray")
        sizes.annotate(
            row["allocation"],
            (len(rows) - 0.5, 100 * row["live_token_utilization"]),
            ha="right",
            va="bottom",
            fontsize=8,
            color="gray",
        )
    sizes.set_xticks(list(x), labels)
    sizes.set(
        xlabel="block size (tokens)",
        ylabel="%",
        ylim=(0, 105),
        title="block sizes at the same memory (dashed: contiguous allocation)",
    )
    sizes.legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
