from pagedgen.entrypoints.cli.main import app

app(prog_name="pagedgen")
