"""The docs against the programs (issue 48): a doc that a test reads cannot drift from the code.

  * every flag that README.md, data/README.md or docs/*.md names is one of hetseq-train's, hetseq-eval's or hetseq-trace's (as
    their --help prints them), or one of a script's that the doc names in the same section, or one of another
    program's (torchrun, Slurm, CMake, pip, ...: OTHER_PROGRAMS, each with its program, which the section must
    name too);
  * every value that an enumerated flag accepts is in that flag's --help. The values come from the program: each
    candidate flag is given a value it cannot accept, and hetseq-train's error lists the valid ones
    ("--zero-sharding: 'x' is not one of none, os, os+grad, full");
  * the exit-code table (the markdown table whose first column is the code, in docs/errors.md or README.md) has
    a row for each code of hetseq/core/error.h's ExitCode and none other, each row meaning what the constant
    does; no code in hetseq/ or tasks/ exits with a number instead of an ExitCode, and a worker whose launcher
    is gone exits with the code of a lost peer;
  * every folder and file that README.md's layout section or docs/layout.md names exists.

The build is found as the other tests find it: beside the hetseq package that PYTHONPATH points to (build/python),
or HETSEQ_BUILD_DIR, or ROOT/build.
"""
import glob
import importlib.util
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Flags of programs other than hetseq's and its scripts' that the docs may show, by program. A flag here counts only
# where the doc names its program in the same section.
OTHER_PROGRAMS = {
    "torchrun": {"--standalone", "--nnodes", "--nproc-per-node", "--max-restarts", "--no-python", "--rdzv-backend",
                 "--rdzv-endpoint", "--rdzv-id"},
    "srun": {"--nodes", "--ntasks", "--ntasks-per-node", "--gres", "--gpus-per-task"},
    "sbatch": {"--nodes", "--gres", "--signal"},
    "cmake": {"--build", "--target", "--install", "--prefix"},
    "pip": {"--no-build-isolation", "--no-deps", "--target"},
    "tensorboard": {"--logdir"},
    "perf": {"--no-children", "--sort"},
}
# Where the scripts that a doc may name live (a doc names them by path or by file name).
SCRIPT_FOLDERS = ("scripts", "benchmarks", "tests", "examples", ".ci")
FLAG = re.compile(r"(?<![\w/-])--([A-Za-z][\w-]*(?:\+[\w-]+)?)")
SCRIPT = re.compile(r"(?<![\w.-])((?:[\w.-]+/)*[\w-]+\.(?:sh|py|sbatch))\b")


def build_dir():
    if os.environ.get("HETSEQ_BUILD_DIR"):
        return os.environ["HETSEQ_BUILD_DIR"]
    spec = importlib.util.find_spec("hetseq")  # locates build/python/hetseq without importing it
    if spec is not None and spec.origin and os.path.basename(os.path.dirname(os.path.dirname(spec.origin))) == "python":
        return os.path.dirname(os.path.dirname(os.path.dirname(spec.origin)))
    return os.path.join(ROOT, "build")


def program(name):
    path = os.path.join(build_dir(), "bin", name)
    assert os.path.exists(path), f"no {name} at {path}: build it (scripts/build.sh), or set HETSEQ_BUILD_DIR"
    return path


def run(args, timeout=60, **env):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)


def flags_in(text):
    return {"--" + m.group(1).rstrip("-") for m in FLAG.finditer(text)}


@pytest.fixture(scope="module")
def train_help():
    p = run([program("hetseq-train"), "--help"])
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.fixture(scope="module")
def program_flags(train_help):
    """Every flag that hetseq's programs print in their --help, aliases named in the help text included."""
    tasks = re.search(r"^Tasks: (.*)$", train_help, re.M)
    assert tasks, "hetseq-train --help has no 'Tasks: ...' line"
    texts = [train_help]
    commands = [[program("hetseq-train"), "--task", t.strip(), "--help"] for t in tasks.group(1).split(",")]
    commands += [[program("hetseq-eval"), "--help"], [program("hetseq-trace"), "--help"]]
    with ThreadPoolExecutor(max_workers=4) as pool:
        for command, p in zip(commands, pool.map(run, commands)):
            assert p.returncode == 0, f"{' '.join(command)}: exit code {p.returncode}: {p.stderr}"
            texts.append(p.stdout)
    return flags_in("\n".join(texts))


def doc_paths():
    return ([os.path.join(ROOT, "README.md"), os.path.join(ROOT, "data", "README.md")] +
            sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))))


def sections(path):
    """The doc's sections (the text under a heading of level 1 or 2, its subsections included, up to the next), each
    as (text, [(line number, line)]). A '#' line inside a fenced code block is a comment, not a heading."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    out, current, fenced = [], [], False
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,2} ", line) and current:
            out.append(current)
            current = []
        current.append((number, line))
    if current:
        out.append(current)
    return [("\n".join(line for _, line in section), section) for section in out]


def script_index():
    """[file name] its paths, for the scripts and benchmark programs that a doc may name by file name alone."""
    index = {}
    for folder in SCRIPT_FOLDERS:
        for directory, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in files:
                index.setdefault(name, []).append(os.path.join(directory, name))
    return index


def script_flags(text, index, cache):
    """The flags that the scripts named in `text` mention in their source: scripts by path or file name
    (scripts/bert_preprocess.py, gpu_check.sh) or by name at the start of a code span (`gpu_check --run`),
    programs built from one source file by their name in a bin/ folder (build/bin/bert-data:
    benchmarks/bert_data.cpp)."""
    paths = []
    for name in SCRIPT.findall(text):
        paths += [os.path.join(ROOT, name)] if os.path.isfile(os.path.join(ROOT, name)) else index.get(
            os.path.basename(name), [])
    for name in re.findall(r"`([\w-]+) --", text):
        paths += index.get(name + ".sh", []) + index.get(name + ".py", [])
    for name in re.findall(r"\bbin/([\w-]+)", text):
        paths += index.get(name.replace("-", "_") + ".cpp", [])
    flags = set()
    for path in paths:
        if path not in cache:
            with open(path, encoding="utf-8", errors="replace") as f:
                cache[path] = flags_in(f.read())
        flags |= cache[path]
    return flags


def named_programs(text):
    return {name for name in OTHER_PROGRAMS if re.search(rf"(?<![\w-]){name}(?![\w-])", text, re.I)}


def test_every_flag_in_the_docs_is_a_flag_of_the_program_it_is_given_to(program_flags):
    """A flag of a script counts on a line that names the script, or, on a line that names none, where its section
    (the text under the same heading of level 1 or 2) names it: prose often speaks of the flags of the command in
    the code block above it. A flag of another program counts where its section names the program."""
    index, cache, unknown = script_index(), {}, []
    for path in doc_paths():
        for text, lines in sections(path):
            in_section = script_flags(text, index, cache)
            programs = set()
            for name in named_programs(text):
                programs |= OTHER_PROGRAMS[name]
            for number, line in lines:
                # A line that names a script is its command line (or speaks of it): its flags are that script's.
                others = (script_flags(line, index, cache) or in_section) | programs
                for m in FLAG.finditer(line):
                    flag = "--" + m.group(1).rstrip("-")
                    if line[m.end():m.end() + 1] == "*":  # a family: `--distributed-*`, `--reset-*`
                        if not any(f.startswith("--" + m.group(1)) for f in program_flags | others):
                            unknown.append(f"{os.path.relpath(path, ROOT)}:{number}: {m.group(0)}*")
                    elif flag not in program_flags and flag not in others:
                        unknown.append(f"{os.path.relpath(path, ROOT)}:{number}: {flag}")
    assert not unknown, ("flags in the docs that neither hetseq-train/-eval/-trace --help nor a script or program "
                         "named in the same section knows (fix the doc, or name the script; another program's "
                         "flag goes into OTHER_PROGRAMS, with its program):\n  " + "\n  ".join(unknown))


def help_entries(help_text):
    """[flag] its entry in --help: the flag's line and the indented lines under it."""
    entries, current = {}, None
    for line in help_text.splitlines():
        m = re.match(r"^ {2,8}(?:-\w, )?(--[\w+-]+)", line)  # a description's next lines are indented further
        if m:
            current = m.group(1)
            entries[current] = line
        elif current and line.startswith(" " * 8) and line.strip():
            entries[current] += "\n" + line
        else:
            current = None
    return entries


def enum_candidates(entries):
    """Flags that take a value ("--flag VALUE", where a switch's help follows after several spaces) and may be
    enumerations: those whose default is one word (not a number, a path or a phrase; the registries' flags,
    --optimizer and --lr_scheduler, are so), and every flag that an "is not one of" error in the sources names."""
    candidates = set()
    for flag, entry in entries.items():
        takes_value = re.match(rf"\s*(?:-\w, )?{re.escape(flag)} \S", entry)
        text = " ".join(entry.split())  # --help wraps its lines anywhere, "(default: " included
        if takes_value and re.search(r"\(default: [A-Za-z][\w+]*\)", text):
            candidates.add(flag)
    for path in glob.glob(os.path.join(ROOT, "hetseq", "**", "*.cpp"), recursive=True):
        with open(path, encoding="utf-8") as f:
            candidates |= set(re.findall(r'"(--[\w+-]+): \'\{\}\' is not one of', f.read()))
    return candidates & set(entries)


def test_every_value_of_an_enumerated_flag_is_in_its_help(train_help):
    entries = help_entries(train_help)
    bad = "no-such-value"

    def values_of(flag):
        p = run([program("hetseq-train"), "--task", "mnist", "--cpu", "--max-sentences", "8",
                 "--data", os.path.join(ROOT, "no-such-data"), flag, bad])
        m = re.search(rf"{re.escape(flag)}: '{bad}' is not one of (.*)$", p.stderr, re.M)
        return flag, p.returncode, [v.strip() for v in m.group(1).split(",")] if m else None

    with ThreadPoolExecutor(max_workers=4) as pool:
        found = {flag: (code, values) for flag, code, values in pool.map(values_of, sorted(enum_candidates(entries)))}
    enums = {flag: values for flag, (code, values) in found.items() if values is not None}
    # The flags that the sources say are enumerations must show up as such, or the candidates miss one.
    assert {"--zero-sharding", "--ddp-comm-hook", "--log-format", "--optimizer", "--lr_scheduler"} <= set(enums), found
    missing = []
    for flag, values in sorted(enums.items()):
        assert found[flag][0] == 2, f"{flag} {bad}: exit code {found[flag][0]}, not 2 (a usage error)"
        for value in values:
            if not re.search(rf"(?<![\w+-]){re.escape(value)}(?![\w+-])", entries[flag]):
                missing.append(f"{flag}: '{value}' (accepted: {', '.join(values)}) is not in its help:\n"
                               f"{entries[flag]}")
    assert not missing, "enumerated flags whose --help omits a value:\n" + "\n".join(missing)


def test_every_task_is_listed_in_the_help(train_help):
    p = run([program("hetseq-train"), "--task", "no-such-task"])
    m = re.search(r"known tasks: (.*)$", p.stderr, re.M)
    assert p.returncode == 2 and m, p.stderr
    listed = re.search(r"^Tasks: (.*)$", train_help, re.M).group(1)
    assert sorted(m.group(1).split(", ")) == sorted(listed.split(", ")), (m.group(1), listed)


def exit_codes_in_code():
    """[code] (constant, comment) of hetseq/core/error.h's enum ExitCode."""
    with open(os.path.join(ROOT, "hetseq", "core", "error.h"), encoding="utf-8") as f:
        body = re.search(r"enum ExitCode[^{]*\{(.*?)\};", f.read(), re.S)
    assert body, "hetseq/core/error.h has no enum ExitCode"
    codes = {}
    for name, value, comment in re.findall(r"(kExit\w+)\s*=\s*(\d+),?\s*//\s*(.*)", body.group(1)):
        assert int(value) not in codes, f"exit code {value} defined twice ({codes[int(value)][0]} and {name})"
        codes[int(value)] = (name, comment)
    assert codes, "no kExit... = N constants with a comment in hetseq/core/error.h"
    return codes


def exit_code_tables():
    """[(doc, [code] meaning)] of each markdown table whose header's first cell is 'code' or 'exit code', in
    docs/errors.md and README.md (the table's old home; a copy left there must agree too)."""
    tables = []
    for path in [os.path.join(ROOT, "docs", "errors.md"), os.path.join(ROOT, "README.md")]:
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        for i, line in enumerate(lines):
            if re.match(r"^\|\s*(exit )?code\s*\|", line, re.I) and i + 1 < len(lines) and "---" in lines[i + 1]:
                rows = {}
                for row in lines[i + 2:]:
                    if not row.startswith("|"):
                        break
                    cells = [c.strip() for c in row.strip().strip("|").split("|")]
                    assert re.fullmatch(r"\d+", cells[0]), f"{path}: exit-code row '{row}' has no number first"
                    assert int(cells[0]) not in rows, f"{path}: exit code {cells[0]} has two rows"
                    rows[int(cells[0])] = cells[1] if len(cells) > 1 else ""
                tables.append((f"{os.path.relpath(path, ROOT)}:{i + 1}", rows))
    assert tables, "no exit-code table (a markdown table whose first column is 'code') in docs/errors.md or README.md"
    return tables


def words(text):
    """The words of `text` that say something (4 letters or more), lower case; CamelCase split."""
    text = re.sub(r"([a-z])([A-Z])", r"\1 \2", text)
    stop = {"with", "from", "that", "this", "what", "when", "after", "before", "error", "hetseq", "exit", "code"}
    return {w for w in re.findall(r"[a-z]{4,}", text.lower()) if w not in stop}


def test_the_exit_code_table_is_the_code():
    code = exit_codes_in_code()
    problems = []
    for doc, table in exit_code_tables():
        for number, (name, comment) in sorted(code.items()):
            if number not in table:
                problems.append(f"{name} = {number} (hetseq/core/error.h: {comment}) has no row in {doc}")
            elif not words(name.replace("kExit", "") + " " + comment) & words(table[number]):
                problems.append(f"{doc} says code {number} means '{table[number]}', but hetseq/core/error.h "
                                f"defines it as {name} ({comment})")
        for number, meaning in sorted(table.items()):
            if number not in code:
                problems.append(f"{doc} has a row for code {number} ('{meaning}'), which hetseq/core/error.h does "
                                f"not define")
    assert not problems, "\n".join(problems)


def test_a_worker_whose_launcher_is_gone_exits_as_a_lost_peer():
    """A worker started by hetseq's launcher that finds the launcher gone (it died before the worker could ask to
    die with it) stops at once with the code of a lost peer: restarting the job resumes it."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    p = run([program("hetseq-train"), "--task", "mnist", "--cpu", "--max-sentences", "8", "--no-save",
             "--data", os.path.join(ROOT, "no-such-data")], HETSEQ_LAUNCHER_PID=str(gone.pid))
    lost_peer = next(number for number, (name, _) in exit_codes_in_code().items() if name == "kExitPeerLost")
    assert p.returncode == lost_peer, (p.returncode, p.stderr)
    assert f"the launcher (pid {gone.pid}) is gone" in p.stderr, p.stderr


def test_no_code_exits_with_a_bare_number():
    """Every exit in the library, the tasks and the programs goes through ExitCode, the table's names."""
    bare = []
    for folder in ("hetseq", "tasks", "python"):
        for path in sorted(glob.glob(os.path.join(ROOT, folder, "**", "*.[ch]*"), recursive=True)):
            with open(path, encoding="utf-8", errors="replace") as f:
                for number, line in enumerate(f, 1):
                    if re.search(r"\b(?:_Exit|_exit|exit|quick_exit)\s*\(\s*-?\d+\s*\)", line):
                        bare.append(f"{os.path.relpath(path, ROOT)}:{number}: {line.strip()}")
    assert not bare, "exits with a number instead of an ExitCode of hetseq/core/error.h:\n  " + "\n  ".join(bare)


def layout_entries(text):
    """The paths that a layout names, as (path, is a folder): in a code block, the first column, at the top
    ("hetseq/", "configs/, data/", ".ci/run") or one level down under the folder above ("  core/",
    "  hetseq.h, version.h"; a description's next lines are indented further); outside code blocks, a code span
    that opens a list item or a table row ("- `scripts/`: ...", "| `tasks/` | ...")."""
    entries, parent, fenced = [], "", False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced, parent = not fenced, ""
            continue
        if fenced:
            column = re.match(r"^( {0,2})([^\s,]+(?:, [^\s,]+)*)", line)
            if not column:
                continue
            for entry in column.group(2).split(", "):
                entries.append((os.path.join(parent, entry) if column.group(1) else entry, entry.endswith("/")))
                if not column.group(1) and entry.endswith("/"):
                    parent = entry
        else:
            item = re.match(r"^\s*(?:[-*]|\|)\s*`([^`\s]+)`", line)
            if item:
                entries.append((item.group(1), item.group(1).endswith("/")))
    return entries


def test_every_folder_of_the_layout_exists():
    """README.md's layout section and the map of the folders (docs/layout.md), where they exist."""
    layouts = []
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        section = re.search(r"^(#{2,3}) [^\n]*\b(?:[Ll]ayout|[Ff]olders)\b[^\n]*\n(.*?)(?=^#{1,3} |\Z)", f.read(),
                            re.S | re.M)
    if section:
        layouts.append(("README.md", section.group(2)))
    if os.path.exists(os.path.join(ROOT, "docs", "layout.md")):
        with open(os.path.join(ROOT, "docs", "layout.md"), encoding="utf-8") as f:
            layouts.append(("docs/layout.md", f.read()))
    assert layouts, "no layout: neither a 'Layout' section in README.md nor docs/layout.md"
    missing = []
    for doc, text in layouts:
        entries = layout_entries(text)
        assert len(entries) >= 5, f"{doc}: its layout names only {entries}"
        for path, folder in entries:
            if not (os.path.isdir if folder else os.path.exists)(os.path.join(ROOT, path)):
                missing.append(f"{doc}: {path}")
    assert not missing, "the layout names what does not exist:\n  " + "\n  ".join(missing)
