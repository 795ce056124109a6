"""The README and docs/ say what mmtx does: every shell command in them is dry-run, every file and
figure they point at exists, each command's ``--help`` examples are among them, and no internal
issue or goal leaks into what users read.

Dry runs, by command (a command no rule knows fails the test, naming it, so a new kind of command
in the docs comes with a way to check it):

- ``mmtx-*``: the command's Hydra config composed in-process with the line's overrides, as
  ``--cfg job`` does (a misspelt key, an unknown option or a sweep without ``-m`` fails);
  ``test_cfg_job_prints_what_the_dry_run_composes`` shows the two agree;
- ``python scripts/X.py``: the script's own argument parser run on the line's arguments, stopped
  right after parsing (``scripts/train_step_flops.py`` takes mmtx-train overrides: composed);
- ``python -c CODE``: compiled, and every name it imports resolved; ``python -m pytest``: its
  markers and paths exist; ``pip install``: every extra and package is one of pyproject.toml's;
- ``torchrun``: torch's own argument parser, then the mmtx-train it starts; ``sbatch``,
  ``bash``: the script exists and parses (``bash -n``), sbatch's arguments composed as the
  mmtx-train overrides the script passes on; ``hf download``, ``wandb sync``: their form.

A lone ``...`` stands for "the keys shown above" and is left out; placeholders such as ``RUN``,
``DIR`` or ``mydata/`` are plain values to a dry run. docs/learning.md, the lab notebook, is
included: its commands are dry-run like the rest (it is left out only of the goal-word check,
since its dated entries say what each screen aimed for).
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import shlex
import subprocess
import sys
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").glob("*.md"))]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
CLIS = sorted(PYPROJECT["project"]["scripts"])  # mmtx-train, mmtx-eval, ...
HYDRA_FLAGS = {"-m", "--multirun", "--help", "-h", "--hydra-help", "--resolve", "--info"}


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


# ---------------------------------------------------------------------------------- reading pages


def fenced_blocks(path: Path, language: str) -> list[tuple[int, str]]:
    """(line of the first line inside, text) of each ```language block, indented ones included."""
    text = path.read_text()
    pattern = re.compile(rf"^([ \t]*)```{language}\n(.*?)^[ \t]*```", flags=re.M | re.S)
    return [(text.count("\n", 0, m.start(2)) + 1, m.group(2)) for m in pattern.finditer(text)]


def shell_lines(block: str, first_line: int) -> Iterator[tuple[int, list[str]]]:
    """(line number, words) of each simple command of a shell block: continuation lines joined,
    comments dropped, lines split at ``&&``, ``||``, ``;`` and ``|``."""
    physical = block.split("\n")
    i = 0
    while i < len(physical):
        start, line = i, physical[i]
        while line.endswith("\\") and i + 1 < len(physical):
            i += 1
            line = line[:-1] + " " + physical[i]
        i += 1
        line = line.replace("$(which mmtx-train)", "mmtx-train")
        words = shlex.split(line, comments=True)
        command: list[str] = []
        for word in [*words, "&&"]:
            if word in ("&&", "||", ";", "|"):
                if command:
                    yield first_line + start, command
                command = []
            else:
                command.append(word)


def page_commands(path: Path) -> list[tuple[str, list[str]]]:
    """``(file:line, words)`` of every command in the page's bash blocks."""
    return [(f"{rel(path)}:{n}", words) for first, block in fenced_blocks(path, "bash")
            for n, words in shell_lines(block, first)]  # fmt: skip


def prose(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of the page's lines outside fenced blocks, inline code removed."""
    fenced = False
    for n, line in enumerate(path.read_text().split("\n"), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield n, re.sub(r"`[^`]*`", "``", line)


# ---------------------------------------------------------------------------------- dry runs


class DryRun:
    """Checks commands without running them; Hydra composes and scripts' argument parsers are
    collected and run in batches (one in-process Hydra per config, one interpreter for scripts)."""

    def __init__(self) -> None:
        self.compose: list[tuple[str, str, list[str]]] = []  # (where, config name, argv)
        self.scripts: list[tuple[str, str, list[str]]] = []  # (where, script path, argv)
        self.problems: list[str] = []

    def fail(self, where: str, words: list[str], why: str) -> None:
        self.problems.append(f"{where}: {shlex.join(words)}\n    {why}")

    def add(self, where: str, words: list[str]) -> None:
        name, *args = words
        while "=" in name and not name.startswith(("-", ".")) and args:  # VAR=value command ...
            name, *args = args
        if name in CLIS:
            config = name.removeprefix("mmtx-")
            if not (REPO / "conf" / f"{config}.yaml").is_file():
                return self.fail(where, words, f"no conf/{config}.yaml for {name}")
            self.compose.append((where, config, args))
        elif name in ("python", "python3"):
            self.python(where, words, args)
        elif name == "pip":
            self.pip(where, words, args)
        elif name == "torchrun":
            self.torchrun(where, words, args)
        elif name == "srun":
            rest = [a for a in args if not a.startswith("-")]
            self.add(where, rest) if rest else self.fail(where, words, "srun of nothing")
        elif name in ("bash", "sbatch"):
            self.shell_script(where, words, name, args)
        elif name == "hf":
            ok = len(args) >= 2 and args[0] == "download" and re.fullmatch(r"[\w.-]+(/[\w.-]+)?", args[1])
            ok = ok and all(a == "--local-dir" or not a.startswith("-") for a in args[2:])
            if not ok:
                self.fail(where, words, "expected: hf download OWNER/NAME [--local-dir DIR]")
        elif name == "wandb":
            if len(args) != 2 or args[0] != "sync":
                self.fail(where, words, "expected: wandb sync DIR")
        elif name == "ruff":
            if args not in (["check", "."], ["format", "--check", "."]):
                self.fail(where, words, "expected: ruff check . or ruff format --check .")
        elif name in (".", "source"):
            if len(args) != 1 or not args[0].endswith("/bin/activate"):
                self.fail(where, words, "expected: . VENV/bin/activate")
        elif name not in ("cd", "export"):
            self.fail(where, words, f"no dry run for {name!r}: teach tests/test_docs.py how to check it")

    def python(self, where: str, words: list[str], args: list[str]) -> None:
        if args[:2] == ["-m", "venv"] and len(args) == 3:
            return
        if args[:2] == ["-m", "pytest"]:
            markers = {m.split(":")[0] for m in PYPROJECT["tool"]["pytest"]["ini_options"]["markers"]}
            rest = iter(args[2:])
            for a in rest:
                if a == "-m":
                    named = set(re.findall(r"\w+", next(rest, ""))) - {"not", "and", "or"}
                    if named - markers:
                        self.fail(where, words, f"unknown pytest markers {sorted(named - markers)}")
                elif a == "-k":
                    next(rest, None)
                elif not a.startswith("-") and not (REPO / a.split("::")[0]).exists():
                    self.fail(where, words, f"no test path {a}")
            return
        if args[:1] == ["-c"] and len(args) == 2:
            return self.python_code(where, words, args[1])
        if args and args[0].startswith("scripts/") and args[0].endswith(".py"):
            script = REPO / args[0]
            if not script.is_file():
                return self.fail(where, words, f"no script {args[0]}")
            if script.name == "train_step_flops.py":  # its arguments are mmtx-train overrides
                return self.compose.append((where, "train", args[1:]))
            if "argparse" not in script.read_text():
                return self.fail(where, words, f"{args[0]} parses no arguments with argparse: no dry run for it")
            return self.scripts.append((where, str(script), args[1:]))
        self.fail(where, words, "no dry run for this python command")

    def python_code(self, where: str, words: list[str], code: str) -> None:
        try:
            tree = ast.parse(code)
        except SyntaxError as e:
            return self.fail(where, words, f"does not compile: {e}")
        if problem := unresolved_imports(tree):
            self.fail(where, words, problem)

    def pip(self, where: str, words: list[str], args: list[str]) -> None:
        if args[:1] != ["install"]:
            return self.fail(where, words, "only pip install is checked")
        extras = PYPROJECT["project"]["optional-dependencies"]
        dependencies = {re.split(r"[<>=!~\[; ]", d)[0].lower() for d in PYPROJECT["project"]["dependencies"]}
        rest = iter(args[1:])
        for a in rest:
            if a in ("--index-url", "--extra-index-url"):
                url = next(rest, "")
                if not url.startswith("https://"):
                    self.fail(where, words, f"{a} {url}: not an https URL")
            elif a in ("-e", "-q", "-U", "--upgrade"):
                continue
            elif m := re.fullmatch(r"(\.|mmtx)(?:\[([\w,-]+)\])?", a):
                unknown = set(filter(None, (m.group(2) or "").split(","))) - set(extras)
                if unknown:
                    self.fail(where, words, f"pyproject.toml has no extra {sorted(unknown)}")
            elif a.lower() not in dependencies:
                self.fail(where, words, f"{a} is not a dependency in pyproject.toml")

    def torchrun(self, where: str, words: list[str], args: list[str]) -> None:
        from torch.distributed.run import get_args_parser

        # placeholders for numbers (--node-rank=R) get a number; torchrun's parser checks the rest
        filled = [re.sub(r"^(--[\w-]+=)[A-Z]+$", r"\g<1>1", a) for a in args]
        try:
            parsed = get_args_parser().parse_args(filled)
        except SystemExit:
            return self.fail(where, words, "torchrun's parser refuses these arguments")
        if parsed.training_script not in CLIS:
            return self.fail(where, words, f"torchrun starts {parsed.training_script}: not an mmtx command")
        self.add(where, [parsed.training_script, *parsed.training_script_args])

    def shell_script(self, where: str, words: list[str], name: str, args: list[str]) -> None:
        if not args or not (REPO / args[0]).is_file():
            return self.fail(where, words, f"no script {args[:1]}")
        syntax = subprocess.run(["bash", "-n", str(REPO / args[0])], capture_output=True, text=True)
        if syntax.returncode:
            return self.fail(where, words, f"bash -n: {syntax.stderr.strip()}")
        if name == "sbatch":  # the batch script passes its arguments on to mmtx-train ("$@")
            text = (REPO / args[0]).read_text()
            if "mmtx-train" not in text or '"$@"' not in text:
                return self.fail(where, words, f"{args[0]} does not pass its arguments to mmtx-train")
            self.compose.append((where, "train", args[1:]))

    # -------------------------------------------------------------------------- the batches

    def run(self, clis: list[list[str]] | None = None, cwd: Path = REPO) -> list[dict]:
        """Dry-run everything collected, the scripts' parsers (and ``clis``: commands run through
        their entry points, e.g. ``--help``) in one interpreter while Hydra composes here; the
        problems found go to ``self.problems``; returns each of ``clis``' exit code and output."""
        jobs = {"clis": [[name, PYPROJECT["project"]["scripts"][name], argv] for name, *argv in clis or []],
                "scripts": [[path, argv] for _, path, argv in self.scripts]}  # fmt: skip
        driver = subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps(jobs), str(REPO)], cwd=cwd,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        self.run_compose()
        out, err = driver.communicate(timeout=300)
        assert driver.returncode == 0, err[-3000:]
        results = json.loads(out.strip().splitlines()[-1])
        for (where, path, argv), problem in zip(self.scripts, results["scripts"]):
            if problem:
                self.fail(where, ["python", rel(Path(path)), *argv], problem)
        return results["clis"]

    def run_compose(self) -> None:
        from hydra import compose, initialize_config_dir
        from hydra.core.override_parser.overrides_parser import OverridesParser

        from mmtx.cli.common import CONFIG_DIR

        parser = OverridesParser.create()
        composed: dict[tuple, str | None] = {}  # (config, overrides) -> the problem, if any
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            for where, config, argv in self.compose:
                words = [f"mmtx-{config}", *argv]
                flags = {a for a in argv if a.startswith("-")}
                overrides, skip = [], False
                for a in argv:  # --cfg job / --cfg hydra take a value
                    if skip:
                        skip = False
                    elif a in ("--cfg", "-c"):
                        skip = True
                    elif not a.startswith("-") and a != "...":
                        overrides.append(a)
                if flags - HYDRA_FLAGS - {"--cfg", "-c"}:
                    self.fail(where, words, f"unknown Hydra flags {sorted(flags - HYDRA_FLAGS)}")
                    continue
                key = (config, tuple(overrides), bool(flags & {"-m", "--multirun"}))
                if key not in composed:  # the same command on two pages is composed once
                    composed[key] = self.composes(compose, parser, *key)
                if composed[key]:
                    self.fail(where, words, composed[key])

    @staticmethod
    def composes(compose, parser, config: str, overrides: tuple[str, ...], multirun: bool) -> str | None:
        """Why ``config`` with ``overrides`` does not compose, or None."""
        try:
            parsed = parser.parse_overrides(list(overrides))
            sweeps = [o for o in parsed if o.is_sweep_override()]
            if sweeps and not multirun:
                raise ValueError(f"{sweeps[0].input_line}: a sweep needs -m")
            for combination in sweep_combinations(parsed):
                compose(config_name=config, overrides=combination, return_hydra_config=True)
        except Exception as e:  # noqa: BLE001 - any composition error is the finding
            return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
        return None


def sweep_combinations(parsed: list) -> list[list[str]]:
    """Override lists that between them use every value of every sweep (the line itself when it
    sweeps nothing): as many as the longest sweep has values, not the whole product."""
    sweeps = [list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.input_line] for o in parsed]
    keys = [f"{o.get_key_element()}=" if o.is_sweep_override() else "" for o in parsed]
    return [[key + values[j % len(values)] for key, values in zip(keys, sweeps)]
            for j in range(max(map(len, sweeps), default=1))]  # fmt: skip


def unresolved_imports(tree: ast.AST) -> str | None:
    """The first ``import``/``from ... import`` of ``tree`` that does not resolve, or None."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [(node.module, alias.name) for alias in node.names]
        else:
            continue
        for module, name in names:
            try:
                imported = importlib.import_module(module)
            except ImportError as e:
                return f"import {module}: {e}"
            if name and not hasattr(imported, name):
                try:
                    importlib.import_module(f"{module}.{name}")
                except ImportError:
                    return f"{module} has no {name}"
    return None


# One interpreter for what needs mmtx's imports: first each CLI's entry point (the function its
# console script calls) on its arguments, its output and exit code kept; then each script run as
# __main__ with the docs' arguments, stopped right after its argument parser returns (no work is
# done; the parser's own refusals, an unknown flag or a bad value, are what is reported).
# argv[1]: JSON {"clis": [[name, "module:function", [args]]], "scripts": [[path, [args]]]}; argv[2]: the repository.
DRIVER = r"""
import argparse, contextlib, importlib, io, json, os, runpy, sys
jobs, repo = json.loads(sys.argv[1]), sys.argv[2]
sys.path[:0] = [os.path.join(repo, "scripts"), repo]
clis, scripts = [], []
for name, target, argv in jobs["clis"]:
    module, function = target.split(":")
    main = getattr(importlib.import_module(module), function)
    sys.argv, out, err, code = [name, *argv], io.StringIO(), io.StringIO(), 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as e:  # sys.exit("message") prints the message and exits 1
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        err.write("" if isinstance(e.code, int) or e.code is None else str(e.code))
    clis.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})

class Parsed(Exception):
    pass
original = argparse.ArgumentParser.parse_args
def parse_args(self, args=None, namespace=None):
    original(self, args, namespace)
    raise Parsed
argparse.ArgumentParser.parse_args = parse_args
for script, argv in jobs["scripts"]:
    sys.argv, err = [script, *argv], io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            runpy.run_path(script, run_name="__main__")
        scripts.append("ran past its argument parsing: no parse_args() call to stop at")
    except Parsed:
        scripts.append(None)
    except SystemExit as e:  # --help exits 0; argparse refuses with 2 and a message
        scripts.append(None if e.code in (0, None) else (err.getvalue().strip().splitlines() or [str(e.code)])[-1])
    except Exception as e:
        scripts.append(f"{type(e).__name__}: {e}")
print(json.dumps({"clis": clis, "scripts": scripts}))
"""


# ---------------------------------------------------------------------------------- the tests


CFG_JOB = ["experiment=vqa_shapes", "task.lr=5e-4", "data.batch_size=64"]
CLI_RUNS = [*[[name, "--help"] for name in CLIS], ["mmtx-train", *CFG_JOB, "--cfg", "job"],
            ["mmtx-train", "task.lrr=1", "--cfg", "job"]]  # fmt: skip


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every page's commands dry-run, and the CLIs' ``--help`` and ``--cfg job`` runs, at once:
    {"problems": {page: its problems}, "cli": {command: output}, "composed": ...}."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf, open_dict

    from mmtx.cli.common import CONFIG_DIR

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):  # what --cfg job should print
        cfg = compose(config_name="train", overrides=CFG_JOB, return_hydra_config=True)
    with open_dict(cfg):
        del cfg["hydra"]
    run = DryRun()
    for page in PAGES:
        for where, words in page_commands(page):
            run.add(where, words)
    outputs = run.run(CLI_RUNS, cwd=tmp_path_factory.mktemp("cli"))
    problems: dict[str, list[str]] = {rel(page): [] for page in PAGES}
    for problem in run.problems:
        problems[problem.split(":", 1)[0]].append(problem)
    cli = {tuple(command): output for command, output in zip(CLI_RUNS, outputs)}
    return {"problems": problems, "cli": cli, "composed": OmegaConf.to_yaml(cfg)}


@pytest.mark.parametrize("page", [rel(p) for p in PAGES])
def test_every_shell_command_of_the_page_dry_runs(page: str, checked: dict) -> None:
    problems = checked["problems"][page]
    assert not problems, f"{len(problems)} command(s) in {page} would fail:\n" + "\n".join(problems)


def test_the_docs_have_shell_commands_to_check() -> None:
    """The dry run is not vacuous: the pages hold commands of every kind it knows."""
    words = [w for page in PAGES for _, w in page_commands(page)]
    names = {w[0] for w in words}
    assert set(CLIS) <= names, set(CLIS) - names
    assert {"python", "pip", "torchrun", "bash"} <= names
    assert sum(w[0] == "mmtx-train" for w in words) >= 30


@pytest.mark.parametrize(
    ("command", "problem"),
    [
        ("mmtx-train model.encoder.dimm=32", "dimm"),
        ("mmtx-train data=nope", "nope"),
        ("mmtx-train task.lr=1e-3,3e-4", "needs -m"),
        ("mmtx-eval ckpt=x.ckpt outptu=m.json", "outptu"),
        ("mmtx-frobnicate ckpt=x", "no dry run"),
        ("python scripts/learning_curves.py --minuts 8", "unrecognized arguments"),
        ("python scripts/learning_curves.py --tasks captions", "unknown task"),
        ("python scripts/nope.py", "no script"),
        ("python scripts/train_step_flops.py model.encoder.dimm=3", "dimm"),
        ("python -c 'from mmtx.export import load_exporter'", "no load_exporter"),
        ("pip install -e '.[demos]'", "no extra"),
        ("pip install tensorflow", "not a dependency"),
        ("python -m pytest -m 'not slowly'", "slowly"),
        ("torchrun --nnodes=2 --node-rnk=0 mmtx-train", "refuses"),
        ("torchrun --nnodes=2 mmtx-train trainer.devicez=1", "devicez"),
        ("sbatch scripts/slurm/train.sbatch trainer.devicez=1", "devicez"),
        ("bash scripts/nope.sh", "no script"),
    ],
)
def test_a_broken_command_fails_the_dry_run(command: str, problem: str) -> None:
    """What each rule catches: a misspelt key, option or flag, a missing script or extra."""
    run = DryRun()
    for n, words in shell_lines(command, 1):
        run.add(f"example:{n}", words)
    run.run()
    assert len(run.problems) == 1 and problem in run.problems[0], run.problems


def test_cfg_job_prints_what_the_dry_run_composes(checked: dict) -> None:
    """``mmtx-train ... --cfg job`` prints the config the in-process compose gives, and refuses a
    misspelt key as it does: the dry run is the CLI's own."""
    good = checked["cli"][("mmtx-train", *CFG_JOB, "--cfg", "job")]
    bad = checked["cli"][("mmtx-train", "task.lrr=1", "--cfg", "job")]
    assert good["code"] == 0, good
    assert good["stdout"].strip() == checked["composed"].strip()
    assert bad["code"] != 0 and "task.lrr" in bad["stdout"] + bad["stderr"], bad


# ------------------------------------------------------------------ --help and the docs agree


def help_examples(text: str) -> list[str]:
    """The example commands of a ``--help`` text: the lines under ``Examples:``, continuations
    joined, comments dropped, whitespace normalised."""
    lines = text.split("Examples:", 1)[1].split("\n")
    examples, current = [], ""
    for line in lines:
        stripped = line.strip()
        if current:
            current += " " + stripped
        elif stripped.startswith(("mmtx-", "python ")) and line.startswith("  "):
            current = stripped
        else:
            continue
        if current.endswith("\\"):
            current = current[:-1]
            continue
        examples.append(normalised(current))
        current = ""
    return examples


def normalised(command: str) -> str:
    return shlex.join(shlex.split(command.replace("\\\n", " "), comments=True))


def test_every_help_example_is_in_the_docs(checked: dict) -> None:
    """Each example a command's ``--help`` shows appears, as a command, in a shell block of the
    README or docs/ (and so is dry-run with the rest). This direction, not the other: the docs
    hold many more commands than a help screen has room for, while an example in --help that no
    page shows (and no test runs) could silently stop working."""
    documented = {shlex.join(words) for page in PAGES for _, words in page_commands(page)}
    missing = {}
    for name in CLIS:
        result = checked["cli"][(name, "--help")]
        text = result["stdout"]
        assert result["code"] == 0 and "Examples:" in text, result
        examples = help_examples(text)
        assert examples and all(e.split()[0] in (name, "mmtx-train", "python") for e in examples), examples
        missing[name] = [e for e in examples if e not in documented]
    assert not any(missing.values()), f"--help examples no README/docs shell block shows: {missing}"


# ------------------------------------------------------------------ files and figures referenced


def referenced_files(path: Path) -> Iterator[tuple[int, str, Path]]:
    """(line, as written, resolved path) of each local file a page points at: the targets of its
    links and images, and the repository paths it names in inline code."""
    for n, line in enumerate(path.read_text().split("\n"), 1):
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if not re.match(r"[a-z]+://|mailto:|#", target):
                yield n, target, (path.parent / target.split("#")[0]).resolve()
    for n, line in prose_with_code(path):
        for code in re.findall(r"`([^`]+)`", line):
            m = re.fullmatch(r"((?:docs|scripts|tests|conf|mmtx)/[\w./-]*?)(?:::[\w\[\]-]+)?[.,;:]?", code)
            if m and not re.search(r"[A-Z]{3,}|\*|\{", m.group(1)):
                yield n, code, REPO / m.group(1)


def prose_with_code(path: Path) -> Iterator[tuple[int, str]]:
    fenced = False
    for n, line in enumerate(path.read_text().split("\n"), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            yield n, line


@pytest.mark.parametrize("page", [rel(p) for p in PAGES])
def test_every_file_and_figure_a_page_points_at_exists(page: str) -> None:
    path = REPO / page
    missing = [f"{page}:{n}: {written}" for n, written, target in referenced_files(path) if not target.exists()]
    assert not missing, "files the page points at that are not there:\n" + "\n".join(missing)


def test_the_pages_point_at_their_figures() -> None:
    """The check above sees the figures: every PNG under docs/ that a page shows is found, and
    the results page names JSON files of docs/curves and docs/bench."""
    found = {target for page in PAGES for _, _, target in referenced_files(page)}
    assert (REPO / "docs/curves/2026-11-27-nompm-3seeds-8min-epyc-bf16.png").resolve() in found
    results = {t for _, _, t in referenced_files(REPO / "docs/results.md")}
    assert {t.parent.name for t in results if t.suffix == ".json"} >= {"curves", "bench"}


def test_mmtx_names_in_inline_code_exist() -> None:
    """``mmtx.x.y`` names in the pages' prose (modules, classes, functions) import."""
    missing = []
    for page in PAGES:
        for n, line in prose_with_code(page):
            for name in re.findall(r"`(mmtx(?:\.\w+)+)(?:\([^`]*\))?`", line):
                parts = name.split(".")
                for cut in range(len(parts), 0, -1):
                    try:
                        obj = importlib.import_module(".".join(parts[:cut]))
                        break
                    except ImportError:
                        continue
                for attr in parts[cut:]:
                    obj = getattr(obj, attr, None)
                if obj is None:
                    missing.append(f"{rel(page)}:{n}: {name}")
    assert not missing, "\n".join(missing)


def test_python_blocks_compile_and_import_what_exists() -> None:
    problems = []
    for page in PAGES:
        for first, code in fenced_blocks(page, "python"):
            try:
                problem = unresolved_imports(ast.parse(code))
            except SyntaxError as e:
                problem = f"does not compile: {e}"
            if problem:
                problems.append(f"{rel(page)}:{first}: {problem}")
        for first, block in fenced_blocks(page, "json"):
            try:
                json.loads(block)
            except json.JSONDecodeError as e:
                problems.append(f"{rel(page)}:{first}: not JSON: {e}")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------ no internal references

# an upstream project's issue tracker may be cited ("Lightning issue #19235")
UPSTREAM = r"\b(Lightning|PyTorch|torch|Hydra|transformers|timm|Gradio|WebDataset|tokenizers|pycocoevalcap)\b"
ISSUE = re.compile(r"\bissues?\s*#?\d+|(?<![\w&#/])#\d+\b", flags=re.I)
GOAL = re.compile(r"\btargets?\b|\baimed (?:for|at)\b|\bgoals?\b", flags=re.I)
ML_TARGET = re.compile(r"patch|pixel|soft|token|regress|label|loss|MSE|_target_", flags=re.I)


def internal_references(text: str, goals: bool) -> Iterator[str]:
    """Issue numbers (but upstream projects' ones, named in the same sentence) and, with
    ``goals``, goal words (but "target" in the learning sense)."""
    for m in ISSUE.finditer(text):
        sentence = text[max(text.rfind(". ", 0, m.start()), text.rfind("\n\n", 0, m.start()), 0) : m.end()]
        if not re.search(UPSTREAM, sentence):
            yield m.group(0)
    if goals:
        for m in GOAL.finditer(text):
            line = text[text.rfind("\n", 0, m.start()) + 1 : text.find("\n", m.end())]
            if not ML_TARGET.search(line.replace(m.group(0), "")):
                yield m.group(0)


def user_facing_text() -> Iterator[tuple[str, int, str, bool]]:
    """(file, line, text, check goal words) of what users read: the pages' prose, the configs'
    comments and help, the package's and scripts' comments and strings."""
    for page in PAGES:
        goals = page.name != "learning.md"
        for n, line in prose(page):
            yield rel(page), n, line, goals
    for path in sorted((REPO / "conf").rglob("*.yaml")):
        for n, line in enumerate(path.read_text().split("\n"), 1):
            yield rel(path), n, line.replace("_target_", ""), True
    for path in sorted([*(REPO / "mmtx").rglob("*.py"), *(REPO / "scripts").glob("*.py")]):
        with tokenize.open(path) as f:
            for tok in tokenize.generate_tokens(f.readline):
                if tok.type in (tokenize.COMMENT, tokenize.STRING):
                    yield rel(path), tok.start[0], tok.string, False


def test_no_issue_numbers_or_internal_goals_in_what_users_read() -> None:
    found = [f"{where}:{n}: {ref!r} in {text.strip()[:120]!r}" for where, n, text, goals in user_facing_text()
             for ref in internal_references(text, goals)]  # fmt: skip
    assert not found, "internal references (issue numbers, goals) in user-facing text:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("fixed in issue 16", ["issue 16"]), ("see #21 for more", ["#21"]), ("the issue target", ["target"]),
        ("short of the +3 aimed for", ["aimed for"]), ("(Lightning issue #19235)", []),
        ("the target is the masked patch's pixels", []), ("a COCO id, #1 of them", ["#1"]),
    ],
)  # fmt: skip
def test_internal_reference_check_knows_upstream_issues_and_targets(text: str, found: list[str]) -> None:
    assert list(internal_references(text, goals=True)) == found
