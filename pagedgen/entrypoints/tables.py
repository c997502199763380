"""Tables of figures for a terminal 80 columns wide: a header rule and no other, headers on two
lines where they are long, one space between columns."""

from rich import box
from rich.table import Table


def figures_table(title: str) -> Table:
    return Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 1, 0, 0),
        pad_edge=False,
    )
