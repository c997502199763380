from pagedgen.cli.main import app

app(prog_name="pagedgen")
