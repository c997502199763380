from typer.core import TyperCommand

try:  # recent typer vendors click
    from typer._click import Context, HelpFormatter
except ImportError:
    from click import Context, HelpFormatter

from pagedgen.entrypoints.cli.options import PANELS


class SectionedCommand(TyperCommand):
    """Plain-text help that reads at 80 columns: options in sections (their rich_help_panel),
    never cut, each with its help; the arguments' section first, then the shared panels in
    their order (options.PANELS), the command's own, and the plain options last."""

    def format_options(self, ctx: Context, formatter: HelpFormatter) -> None:
        sections: dict[str, list[tuple[bool, tuple[str, str]]]] = {}
        for param in self.get_params(ctx):
            row = param.get_help_record(ctx)
            if row is not None:
                argument = param.param_type_name == "argument"
                name = getattr(param, "rich_help_panel", None) or ("Arguments" if argument else "")
                sections.setdefault(name, []).append((argument, row))
        order = sorted(
            sections, key=lambda name: (not any(a for a, _ in sections[name]), _rank(name))
        )
        for name in order:
            rows = sorted(sections[name], key=lambda entry: not entry[0])  # arguments first
            with formatter.section(name or "Options"):
                formatter.write_dl([row for _, row in rows])


def _rank(name: str) -> int:
    """Where a panel goes: the shared ones in PANELS' order, then the others, then no panel."""
    if not name:
        return len(PANELS) + 1
    return PANELS.index(name) if name in PANELS else len(PANELS)
