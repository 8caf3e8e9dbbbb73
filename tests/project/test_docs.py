"""The README and every page in docs/ are checked like code: a command, a flag, a path, a module name or a link
that the code no longer has makes the page wrong, and this test says where.

Checked on each page: every ``python -m X`` (and ``python launch.py``) names a module that exists (ours, or an
installed one such as pytest) and, where the command line is ours, every flag it passes is one its argparse
parser takes (the parser is built by calling the CLI and stopping it at ``parse_args``: nothing runs); every
repository path in backticks exists (``tests/x.py::test_name``: the test too); every dotted name in backticks
(``engine.divergence.first_disagreement``) is a module, or a name defined in one; every relative link resolves,
its ``#anchor`` included. The README stays a tour of at most 350 lines, links every page of docs/, and
keeps the test command that .ci/run runs verbatim.

And the facts the pages state about the code: a list of token kinds names the engine's kinds and no other
(``engine.events.TOKEN_KINDS``), every module of a folder on docs/engine.md's layout is named on its row, and every
command-line tool in bench/ is shown on some page.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import re
from functools import cache
from pathlib import Path
from unittest import mock

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 350
OUR_PACKAGES = ("engine", "app", "bench", "tests", "scripts")
ROOT_ENTRIES = {p.name for p in REPO.iterdir() if not p.name.startswith(".git")} - {".venv"}

FENCED = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"`([^`\n]+(?:\n[^`\n]+)*)`")
COMMAND = re.compile(r"(?:python3? -m ([A-Za-z_][\w.]*)|(?:python3? )?\b(launch)\.py)([^;&|#`\n]*)")
FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+)$", re.MULTILINE)
DOTTED = re.compile(r"^((?:engine|app|bench)(?:\.\w+)+)(?:\(.*\))?$")
LAYOUT_ROW = re.compile(r"^([\w.]+/(?:[\w.]+/)*|[\w.]+\.py) {2,}", re.MULTILINE)  # a folder tree's rows
CLASS = re.compile(r"^([A-Z][a-z0-9]+[A-Z]\w*)(?:\.(\w+))?(?:\(.*\))?$")  # ChatEngine, ModelRunner.rollback


KIND_LIST = re.compile(r"`[\w-]+`(?:(?:,\s*(?:and\s+|or\s+)?|\s+and\s+|\s+or\s+|\s*/\s*)`[\w-]+`)+")


# ---- reading a page --------------------------------------------------------------------------------------
def code_spans(text: str) -> tuple[list[str], list[str]]:
    """(fenced blocks, inline code spans). A fenced block's shell lines joined at their ``\\`` continuations."""
    blocks = [b.replace("\\\n", " ") for b in FENCED.findall(text)]
    return blocks, INLINE.findall(FENCED.sub("", text))


def prose(text: str) -> str:
    """The page without its code: what is left is where links live."""
    return INLINE.sub("", FENCED.sub("", text))


def commands(text: str) -> list[tuple[str, list[str]]]:
    """(module, flags) of every ``python -m MODULE ...`` or ``python launch.py ...`` in the page's code."""
    blocks, inline = code_spans(text)
    found = []
    for span in blocks + [s.replace("\n", " ") for s in inline]:
        for module, launch, rest in COMMAND.findall(span):
            found.append((module or launch, [f.split("=")[0] for f in FLAG.findall(rest)]))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(h) for h in HEADING.findall(FENCED.sub("", page.read_text()))}


# ---- what the repository has -----------------------------------------------------------------------------
def our_module_file(module: str) -> Path | None:
    """The file of one of our modules (``launch`` is launch.py), or None when it is not ours."""
    if module == "launch":
        return REPO / "launch.py"
    if module.split(".")[0] not in OUR_PACKAGES:
        return None
    base = REPO.joinpath(*module.split("."))
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), base.with_suffix(".py"))


@cache
def cli_options(module: str) -> frozenset[str]:
    """The option strings of our command line ``module``: its parser, built by calling its ``parse_args``
    function (launch.py) or its ``main`` and stopping at ``ArgumentParser.parse_args``."""
    class Built(Exception):
        pass

    def stop(parser, *args, **kwargs):
        raise Built(parser)

    entry = importlib.import_module(module)
    call = getattr(entry, "parse_args", None) or entry.main
    with mock.patch.object(argparse.ArgumentParser, "parse_args", stop), pytest.raises(Built) as built:
        call([])
    return frozenset(built.value.args[0]._option_string_actions)


@cache
def our_classes() -> dict[str, list[ast.ClassDef]]:
    """Every class defined in engine/, app/ and bench/, by name."""
    found: dict[str, list[ast.ClassDef]] = {}
    for path in sorted(p for top in ("engine", "app", "bench") for p in (REPO / top).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(node)
    return found


def defined_names(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    """Names bound at the top of a module or class body: functions, classes, assignments, imports."""
    names: dict[str, ast.stmt] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update({t.id: node for t in targets if isinstance(t, ast.Name)})
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update({(a.asname or a.name).split(".")[0]: node for a in node.names})
    return names


# ---- the checks: each returns its problems as sentences --------------------------------------------------
def command_problems(text: str) -> list[str]:
    problems = []
    for module, flags in commands(text):
        path, command = our_module_file(module), "python launch.py" if module == "launch" else f"python -m {module}"
        if path is None:
            if importlib.util.find_spec(module.split(".")[0]) is None:
                problems.append(f"{command}: no such module")
            continue
        if not path.is_file() or "__main__" not in path.read_text():
            problems.append(f"{command}: no such command line in the repo")
            continue
        unknown = sorted(set(flags) - cli_options(module) - {"-h", "--help"})
        problems += [f"{command}: no option {flag}" for flag in unknown]
    return problems


def expand_braces(path: str) -> list[str]:
    """``tests/data/x{,2}.jsonl`` -> both names, as a shell would."""
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    return [p for alt in match.group(1).split(",")
            for p in expand_braces(path[:match.start()] + alt + path[match.end():])]


def path_problems(text: str) -> list[str]:
    """Paths in backticks, and the rows of a folder tree in a fenced block (``engine/decode/   the loop ...``)."""
    blocks, inline = code_spans(text)
    problems = [f"folder tree: no {row}" for block in blocks for row in LAYOUT_ROW.findall(block)
                if not (REPO / row).exists()]
    for span in inline:
        file, _, test = span.partition("::")
        if " " in span or file.split("/")[0] not in ROOT_ENTRIES or ("/" not in file and "." not in file):
            continue
        for name in expand_braces(file):
            if not (REPO / name).exists():
                problems.append(f"`{span}`: no such path")
            elif test and test.split("[")[0] not in defined_names(ast.parse((REPO / name).read_text()).body):
                problems.append(f"`{span}`: no such test in {name}")
    return problems


def matching_spans(text: str, pattern: re.Pattern) -> list[re.Match]:
    """The page's inline code spans that are wholly a ``pattern``."""
    return [m for m in map(pattern.match, code_spans(text)[1]) if m]


def name_problems(text: str) -> list[str]:
    problems = []
    for match in matching_spans(text, DOTTED):
        span, parts = match.string, match.group(1).split(".")
        cut = max((i for i in range(1, len(parts) + 1) if our_module_file(".".join(parts[:i])).is_file()),
                  default=0)
        if cut == 0:
            problems.append(f"`{span}`: no such module")
            continue
        body = ast.parse(our_module_file(".".join(parts[:cut])).read_text()).body
        for attr in parts[cut:]:
            node = defined_names(body).get(attr)
            if node is None:
                problems.append(f"`{span}`: {attr} is not defined there")
                break
            body = node.body if isinstance(node, ast.ClassDef) else []
            if not body:
                break  # a function or a value: what follows is its attribute, not checked here
    return problems


def class_problems(text: str) -> list[str]:
    """A class named in backticks (``ChatEngine``, ``ModelRunner.rollback``) is one of ours, with that member."""
    problems = []
    for match in matching_spans(text, CLASS):
        span, (name, member) = match.string, match.groups()
        classes = our_classes().get(name)
        if not classes:
            problems.append(f"`{span}`: no class {name} in engine/, app/ or bench/")
        elif member and not any(member in defined_names(c.body) for c in classes):
            problems.append(f"`{span}`: {name} has no {member}")
    return problems


def link_problems(page: Path, text: str) -> list[str]:
    problems = []
    for target in LINK.findall(prose(text)):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not ours to check
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            problems.append(f"link {target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            problems.append(f"link {target}: no heading #{anchor} in {linked.name}")
    return problems


def page_problems(page: Path, text: str) -> list[str]:
    return (command_problems(text) + path_problems(text) + name_problems(text) + class_problems(text)
            + link_problems(page, text))


# ---- the tests -------------------------------------------------------------------------------------------
# ---- the facts a page states about the code --------------------------------------------------------------
def kind_problems(text: str) -> list[str]:
    """A list of backticked words that names two or more token kinds is a list of token kinds: each must be one."""
    from engine.events import TOKEN_KINDS

    problems = []
    for span in KIND_LIST.findall(text):
        items = re.findall(r"`([\w-]+)`", span)
        if len(set(items) & set(TOKEN_KINDS)) >= 2:
            problems += [f"{item!r} in {span!r} is not a token kind (engine.events.TOKEN_KINDS: {TOKEN_KINDS})"
                         for item in items if item not in TOKEN_KINDS]
    return problems


def layout_rows(text: str) -> dict[str, str]:
    """docs/engine.md's layout block: folder -> its row's words (continuation lines joined)."""
    block = FENCED.findall(text[text.index("## Layout"):])[0]
    rows: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        if match := LAYOUT_ROW.match(line + "  "):
            current = match.group(1)
            rows[current] = line[len(current):]
        elif current:
            rows[current] += " " + line.strip()
    return rows


def layout_problems(text: str, root: Path = REPO) -> list[str]:
    """Each Python module of a folder on the layout is named on the folder's row: a new module is placed on the map."""
    problems = []
    for folder, row in layout_rows(text).items():
        if not folder.endswith("/") or not (root / folder).is_dir():
            continue
        words = set(re.findall(r"\w+", row))
        problems += [f"docs/engine.md's layout row {folder} does not name its module {module.stem}"
                     for module in sorted((root / folder).glob("*.py"))
                     if module.stem != "__init__" and module.stem not in words]
    return problems


def cli_problems(pages: list[str], root: Path = REPO) -> list[str]:
    """Every command-line tool in bench/ (a module that runs as ``__main__``) is shown on some page as
    ``python -m bench....``."""
    shown = {module for text in pages for module, _ in commands(text)}
    tools = sorted(".".join(p.relative_to(root).with_suffix("").parts) for p in (root / "bench").rglob("*.py")
                   if 'if __name__ == "__main__"' in p.read_text())
    return [f"{tool} is a command-line tool that no page shows (python -m {tool})" for tool in tools
            if tool not in shown]


def test_the_pages_state_the_codes_facts():
    texts = [page.read_text() for page in PAGES]
    assert [p for text in texts for p in kind_problems(text)] == []
    assert layout_problems((REPO / "docs" / "engine.md").read_text()) == []
    assert cli_problems(texts) == []


def test_the_fact_checks_catch_a_planted_wrong_token_kind_an_unplaced_module_and_a_hidden_tool(tmp_path):
    engine_md = (REPO / "docs" / "engine.md").read_text()
    planted = engine_md.replace("(`accepted`, `corrected`, `bonus`, `plain`, `cached`)",
                                "(`accepted`, `corrected`, `bonus`, `target`, `cached`)")
    assert planted != engine_md and kind_problems(planted) == [
        f"'target' in '`accepted`, `corrected`, `bonus`, `target`, `cached`' is not a token kind "
        f"(engine.events.TOKEN_KINDS: {__import__('engine.events').events.TOKEN_KINDS})"]
    (tmp_path / "engine" / "serve").mkdir(parents=True)
    (tmp_path / "engine" / "serve" / "new_part.py").write_text("")
    assert layout_problems(engine_md, tmp_path) == [
        "docs/engine.md's layout row engine/serve/ does not name its module new_part"]
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "hidden.py").write_text('if __name__ == "__main__":\n    pass\n')
    assert cli_problems([engine_md], tmp_path) == [
        "bench.hidden is a command-line tool that no page shows (python -m bench.hidden)"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_command_flag_path_name_and_link_on_the_page_exists(page):
    assert page_problems(page, page.read_text()) == []


def test_the_readme_is_a_tour_that_links_every_page_of_docs():
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in LINK.findall(prose(text))}
    assert [p.name for p in PAGES[1:] if p.resolve() not in linked] == []


def test_the_readme_keeps_the_test_command_that_ci_runs_verbatim():
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    command = ci[ci.index("# --- the README's test command, verbatim ---") + 1]
    assert command in README.read_text().splitlines()


def test_the_checks_catch_a_broken_command_flag_path_name_and_link():
    """The same checks on a page with one mistake of each kind: each is found (a check that finds nothing on a
    broken page would pass on every page)."""
    broken = ("Run `python -m bench.speed.nope --k 4`, `python -m bench.speed.modes --no-such-flag 2` and\n"
              "`python launch.py --prot 80`, read `engine/decode/gone.py` and\n"
              "`tests/project/test_docs.py::test_that_was_never_written`, call `engine.divergence.no_such_function()`,\n"
              "`ChatEngine.no_such_method` of `NoSuchEngine`,\n"
              "see [the engine](docs/engine.md#no-such-heading) and [gone](docs/gone.md).\n"
              "```bash\npython -m bench.cache.evaluate --pairs x.jsonl \\\n    --judge-typo 1\n```\n"
              "```\nengine/decode/   the loop\nengine/gone/     was here\n```\n")
    assert page_problems(README, broken) == [
        "python -m bench.cache.evaluate: no option --judge-typo",
        "python -m bench.speed.nope: no such command line in the repo",
        "python -m bench.speed.modes: no option --no-such-flag",
        "python launch.py: no option --prot",
        "folder tree: no engine/gone/",
        "`engine/decode/gone.py`: no such path",
        "`tests/project/test_docs.py::test_that_was_never_written`: no such test in tests/project/test_docs.py",
        "`engine.divergence.no_such_function()`: no_such_function is not defined there",
        "`ChatEngine.no_such_method`: ChatEngine has no no_such_method",
        "`NoSuchEngine`: no class NoSuchEngine in engine/, app/ or bench/",
        "link docs/engine.md#no-such-heading: no heading #no-such-heading in engine.md",
        "link docs/gone.md: no such file",
    ]


def test_a_correct_page_of_each_kind_passes():
    fine = ("`python -m bench.speed.modes --prompts p.jsonl --modes target` and `python -m pytest -k x`,\n"
            "`engine/decode/speculative.py`, `tests/project/test_docs.py::test_a_correct_page_of_each_kind_passes`,\n"
            "`engine.costs.costmodel.StepCosts.speedup(α, k)`, `ModelRunner.rollback`, `EngineSurface`,\n"
            "[layout](docs/engine.md#layout).\n")
    assert page_problems(README, fine) == []


def test_anchors_follow_githubs_slugs():
    assert slug("The semantic cache at scale: Redis 8 vector sets") == "the-semantic-cache-at-scale-redis-8-vector-sets"
    assert slug("Precisions, and what `auto` picks") == "precisions-and-what-auto-picks"
    assert slug("llama.cpp as a peer") == "llamacpp-as-a-peer"
