"""The README is a front door and the docs say only what the repository does.

- README.md stays short (at most 160 lines) and links every ``docs/*.md`` page;
- every ``coevolve ...`` line of a ```bash / ```sh / ```shell block in README.md or docs/ names a
  command of the CLI's tree, and every ``--flag`` on it is an option of that command (a renamed
  command or flag fails here); every distinct command's ``--help`` runs;
- every ``make TARGET`` line names a target of the Makefile;
- every relative Markdown link points to a file that exists (and, for a ``#fragment`` into a
  Markdown page, to one of its headings), and every repository path written in code
  (``coevolve/x.py``, ``sql/reports/*.sql``, ``configs/tiny.yaml``) exists.

No command runs except ``--help``; no network. Run alone with
``python -m pytest -q -p no:cacheprovider tests/test_docs.py``.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
MAX_README_LINES = 160

# a fenced block: its info string and its text
_FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
_SHELL = {"bash", "sh", "shell", "console"}
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")
_INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
# a repository path as written in code: a top-level folder of the repo, then a path
_TOP = ("coevolve", "flows", "sql", "configs", "tests", "deployments", "infra", "docs")
_PATH = re.compile(r"(?<![\w./$~-])((?:" + "|".join(_TOP) + r")/[\w./*-]*)")


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:  # a page outside the repository (the checks' own test)
        return str(path)


@dataclass(frozen=True)
class ShellLine:
    page: str
    lineno: int
    words: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.page}:{self.lineno}: {' '.join(self.words)}"


def fenced_blocks(text: str) -> list[tuple[str, str, int]]:
    """(language, body, line number of the body's first line) of every fenced block."""
    return [(m.group(1).lower(), m.group(2), text.count("\n", 0, m.start(2)) + 1) for m in _FENCE.finditer(text)]


def shell_lines(page: Path, text: str | None = None) -> list[ShellLine]:
    """Every command line of the page's shell blocks, as shell words: a leading ``$ `` and trailing
    comments dropped, backslash continuations joined, ``a && b`` / ``a; b`` / ``a | b`` split."""
    text = page.read_text() if text is None else text
    out = []
    for lang, body, first in fenced_blocks(text):
        if lang not in _SHELL:
            continue
        lines = body.splitlines()
        i = 0
        while i < len(lines):
            lineno, line = first + i, lines[i]
            while line.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line.rstrip()[:-1] + " " + lines[i]
            i += 1
            line = line.strip()
            if line.startswith("$ "):
                line = line[2:]
            try:
                lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
                lexer.whitespace_split = True
                lexer.commenters = "#"
                words = list(lexer)
            except ValueError:  # unbalanced quotes: not a command line (output)
                continue
            command: list[str] = []
            for word in [*words, ";"]:
                if word and set(word) <= set(";&|"):
                    if command:
                        out.append(ShellLine(_rel(page), lineno, tuple(command)))
                    command = []
                else:
                    command.append(word)
    return out


def inline_lines(page: Path, text: str | None = None) -> list[ShellLine]:
    """Commands written in inline code in the prose (`` `coevolve bench rollout --episodes 16` ``)."""
    text = page.read_text() if text is None else text
    prose = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    out = []
    for m in _INLINE.finditer(prose):
        span = m.group(1).strip()
        if not re.match(r"^(coevolve|make) ", span):
            continue
        try:
            words = shlex.split(span, comments=True)
        except ValueError:
            continue
        out.append(ShellLine(_rel(page), prose.count("\n", 0, m.start()) + 1, tuple(words)))
    return out


def _placeholder(word: str) -> bool:
    """``COMMAND``, ``...``: a word that stands for any command."""
    return word == "..." or bool(re.fullmatch(r"[A-Z][A-Z_]*", word))


def cli_app() -> Any:
    """The full ``coevolve`` app: ``flows.cli`` once the Prefect-driving commands live there."""
    try:
        from flows.cli import app  # type: ignore[import-not-found]
    except ModuleNotFoundError as exc:
        if exc.name not in ("flows.cli",):
            raise
        from coevolve.cli import app
    return app


_COMMAND: Any = None


def root_command() -> Any:
    global _COMMAND
    if _COMMAND is None:
        import typer

        _COMMAND = typer.main.get_command(cli_app())
    return _COMMAND


def _options(command: Any) -> set[str]:
    opts = {"--help"}
    for param in command.params:
        opts.update(o for o in [*param.opts, *param.secondary_opts] if o.startswith("-"))
    return opts


def check_coevolve(words: tuple[str, ...], root: Any) -> tuple[tuple[str, ...], list[str]]:
    """(command path, problems) of one ``coevolve ...`` line: the path is walked down the command
    tree while words name subcommands; every ``-x`` / ``--flag[=value]`` must be an option of the
    command reached."""
    command, path, problems = root, [], []
    rest = list(words[1:])
    while rest and hasattr(command, "commands") and not rest[0].startswith("-"):
        if _placeholder(rest[0]):
            return tuple(path), problems
        sub = command.commands.get(rest[0])
        if sub is None:
            problems.append(f"no command 'coevolve {' '.join([*path, rest[0]])}'")
            return tuple(path), problems
        path.append(rest.pop(0))
        command = sub
    if hasattr(command, "commands") and rest and not rest[0].startswith("-"):
        problems.append(f"no command 'coevolve {' '.join([*path, rest[0]])}'")
    known = _options(command)
    for word in rest:
        if not word.startswith("-") or word == "-" or re.fullmatch(r"-\d[\d.e]*", word):
            continue
        flag = word.split("=", 1)[0]
        if flag not in known:
            problems.append(f"'coevolve {' '.join(path)}' has no option {flag} (it has {', '.join(sorted(known))})")
    return tuple(path), problems


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    targets = set()
    for m in re.finditer(r"^([A-Za-z0-9_][A-Za-z0-9_ .-]*?)\s*:(?!=)", text, re.MULTILINE):
        targets.update(m.group(1).split())
    return targets


def check_make(words: tuple[str, ...], targets: set[str]) -> list[str]:
    named = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    return [f"the Makefile has no target '{t}'" for t in named if t not in targets]


def github_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings (lowercased, punctuation dropped, spaces -> '-')."""
    anchors: dict[str, int] = {}
    out = set()
    body = _FENCE.sub("", text)
    for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", body, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = anchors.get(slug, 0)
        anchors[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def missing_links(page: Path, text: str | None = None) -> list[str]:
    """Relative links of a page whose file (or heading) does not exist."""
    text = page.read_text() if text is None else text
    out = []
    for m in _LINK.finditer(_FENCE.sub("", text)):
        target = m.group(1) or m.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, fragment = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            out.append(f"{_rel(page)} links to {target}: {file_part} does not exist")
        elif fragment and dest.suffix == ".md" and fragment not in github_anchors(dest.read_text()):
            out.append(f"{_rel(page)} links to {target}: no heading #{fragment} in {_rel(dest)}")
    return out


def code_paths(text: str) -> set[str]:
    """Repository paths written in inline code or in fenced blocks (``coevolve/store.py``,
    ``sql/reports/*.sql``, ``flows/evolve.py:evolve`` -> ``flows/evolve.py``)."""
    spans = [m.group(1) for m in _INLINE.finditer(_FENCE.sub("", text))]
    spans += [body for _, body, _ in fenced_blocks(text)]
    paths = set()
    for span in spans:
        for m in _PATH.finditer(span):
            path = m.group(1).rstrip(".,;")
            if "<" in path or "{" in path:
                continue
            paths.add(path)
    return paths


def missing_paths(page: Path, text: str | None = None) -> list[str]:
    text = page.read_text() if text is None else text
    out = []
    for path in sorted(code_paths(text)):
        exists = any(ROOT.glob(path.rstrip("/"))) if "*" in path else (ROOT / path).exists()
        if not exists:
            out.append(f"{_rel(page)} names {path}, which does not exist")
    return out


ALL_LINES = [line for page in PAGES for line in [*shell_lines(page), *inline_lines(page)]]
COEVOLVE_LINES = [line for line in ALL_LINES if line.words[0] == "coevolve"]
MAKE_LINES = [line for line in ALL_LINES if line.words[0] == "make"]


# --- the front door ---------------------------------------------------------------------------


def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines; move depth into a docs/ page (at most {MAX_README_LINES})"


def test_docs_exist():
    assert DOCS, "docs/ has no page"


def test_readme_links_every_docs_page():
    text = README.read_text()
    linked = {(README.parent / (m.group(1) or "")).resolve() for m in _LINK.finditer(text) if m.group(1)}
    unlinked = [_rel(p) for p in DOCS if p.resolve() not in linked]
    assert not unlinked, f"README.md does not link: {', '.join(unlinked)}"


# --- commands ----------------------------------------------------------------------------------


def test_shell_blocks_have_coevolve_commands():
    assert len(COEVOLVE_LINES) >= 10, [str(line) for line in COEVOLVE_LINES]


@pytest.mark.parametrize("line", COEVOLVE_LINES, ids=str)
def test_coevolve_command_and_flags_exist(line: ShellLine):
    _, problems = check_coevolve(line.words, root_command())
    assert not problems, f"{line.page}:{line.lineno}: " + "; ".join(problems)


def test_every_documented_command_prints_help():
    from typer.testing import CliRunner

    runner = CliRunner()
    paths = sorted({check_coevolve(line.words, root_command())[0] for line in COEVOLVE_LINES})
    failed = []
    for path in paths:
        result = runner.invoke(cli_app(), [*path, "--help"])
        if result.exit_code != 0 or "Usage" not in result.output:
            failed.append(f"coevolve {' '.join(path)} --help: exit {result.exit_code}\n{result.output[-500:]}")
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("line", MAKE_LINES, ids=str)
def test_make_targets_exist(line: ShellLine):
    problems = check_make(line.words, make_targets())
    assert not problems, f"{line.page}:{line.lineno}: " + "; ".join(problems)


# --- paths -------------------------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_links_resolve(page: Path):
    missing = missing_links(page)
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_code_paths_exist(page: Path):
    missing = missing_paths(page)
    assert not missing, "\n".join(missing)


# --- the checks themselves can fail ------------------------------------------------------------


def test_checks_catch_renamed_commands_flags_targets_and_paths(tmp_path: Path):
    page = tmp_path / "page.md"
    text = (
        "```bash\n"
        "$ coevolve run --config configs/tiny.yaml --roundz 2   # a renamed flag\n"
        "coevolve bench nosuch --rows 3\n"
        "coevolve sql --store /tmp/cv \"select 1 -- '#' not a comment\" && make no-such-target\n"
        "coevolve bench signals \\\n"
        "    --rows=10 --bogus\n"
        "```\n"
        "See [gone](gone.md), [a heading](#nowhere), [ok](#a-heading), `coevolve/no_such_module.py` and `sql/nowhere/*.sql`.\n"
        "# A heading\n"
    )
    page.write_text(text)
    inline = inline_lines(page, "Run `coevolve bench COMMAND --help`, `coevolve bench ...` or `coevolve evall`.")
    assert [check_coevolve(line.words, root_command())[1] for line in inline][:2] == [[], []]
    assert "coevolve evall" in check_coevolve(inline[2].words, root_command())[1][0]
    lines = shell_lines(page)
    assert [line.words[:2] for line in lines] == [
        ("coevolve", "run"),
        ("coevolve", "bench"),
        ("coevolve", "sql"),
        ("make", "no-such-target"),
        ("coevolve", "bench"),
    ]
    root = root_command()
    problems = [check_coevolve(line.words, root)[1] for line in lines if line.words[0] == "coevolve"]
    assert "--roundz" in problems[0][0]
    assert "bench nosuch" in problems[1][0]
    assert problems[2] == []  # quoted SQL: its '#' and '--' are not comments or flags
    assert len(problems[3]) == 1 and "--bogus" in problems[3][0]  # --rows=10 is an option
    assert check_make(lines[3].words, make_targets()) == ["the Makefile has no target 'no-such-target'"]
    assert check_make(("make", "test"), make_targets()) == []
    links = missing_links(page, text)
    assert any("gone.md" in m for m in links) and any("#nowhere" in m for m in links)
    assert not any("#a-heading" in m for m in links)  # the link to an existing heading is fine
    assert len(links) == 2
    paths = code_paths(text)
    assert {"coevolve/no_such_module.py", "sql/nowhere/*.sql", "configs/tiny.yaml"} <= paths
    page_missing = missing_paths(page, text)
    assert any("coevolve/no_such_module.py" in m for m in page_missing)
    assert any("sql/nowhere/*.sql" in m for m in page_missing)
    assert not any("configs/tiny.yaml" in m for m in page_missing)
