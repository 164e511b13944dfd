"""The Python examples of the docs, run as written: every ```python block of docs/python.md and of README.md's
"From Python" section runs as a script of its own (a block that needs several ranks starts them itself) and must
exit 0 with, as the last line of its output, what the block's closing comment `# Prints: ...` says. Where the page
shows a block's whole output (a ```text block after a line "It prints"), the output must be that, line for line."""
import os
import re
import signal
import subprocess
import sys

import pytest

import hetseq

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRINTS = re.compile(r"^# Prints: (.+)$")
TIMEOUT_S = 240  # a block takes 2 to 20 s on a 2-core machine; the rest is room for a loaded one


def section(text, heading):
    """The text of the section `heading` (a "## " heading) up to the next "## " heading."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def examples(path, heading=None):
    """[(name, code, shown)] of `path`'s ```python blocks: `shown` is the ```text block that follows it after a
    paragraph beginning "It prints" (the block's whole output), else None."""
    with open(os.path.join(ROOT, path)) as f:
        text = f.read()
    if heading is not None:
        text = section(text, heading)
    found = []
    pattern = re.compile(r"^```python\n(.*?)^```\n(?:\n(It prints[^\n]*\n(?:[^\n`][^\n]*\n)*)\n```text\n(.*?)^```)?",
                         re.M | re.S)
    for i, m in enumerate(pattern.finditer(text), start=1):
        found.append((f"{path} block {i}", m.group(1), m.group(3)))
    return found


BLOCKS = examples("docs/python.md") + examples("README.md", "From Python")


def package_path():
    """PYTHONPATH for the scripts: the folder of the hetseq package this test imported (build/python under
    scripts/test.sh), then whatever was set."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(hetseq.__file__)))
    return os.pathsep.join([here] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


def run_script(path, cwd):
    env = dict(os.environ, PYTHONPATH=package_path(), OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    # A session of its own, killed as a whole past the deadline: a rank left behind would wait for its peers.
    p = subprocess.Popen([sys.executable, str(path)], cwd=cwd, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        stdout, stderr = p.communicate()
        raise AssertionError(f"{path} ran past {TIMEOUT_S} s\nstdout:\n{stdout}\nstderr:\n{stderr[-8000:]}")
    return p.returncode, stdout, stderr


def test_the_pages_have_their_examples():
    names = [name for name, _, _ in BLOCKS]
    assert sum(name.startswith("docs/python.md") for name in names) >= 5, names
    assert sum(name.startswith("README.md") for name in names) == 1, names
    assert any(shown is not None for _, _, shown in BLOCKS)


@pytest.mark.parametrize("name,code,shown", BLOCKS, ids=[name for name, _, _ in BLOCKS])
def test_an_example_runs_as_written(tmp_path, name, code, shown):
    last = code.rstrip("\n").splitlines()[-1]
    m = PRINTS.match(last)
    assert m, f"{name} does not end with a line '# Prints: ...' saying what it prints last; it ends with: {last}"
    script = tmp_path / "example.py"
    script.write_text(code)
    code_, stdout, stderr = run_script(script, tmp_path)
    assert code_ == 0, f"{name} exited {code_}\nstdout:\n{stdout}\nstderr:\n{stderr[-8000:]}"
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert lines, f"{name} printed nothing\nstderr:\n{stderr[-8000:]}"
    assert lines[-1] == m.group(1), f"{name}: its last line is\n  {lines[-1]}\nand the page says\n  {m.group(1)}"
    if shown is not None:
        assert lines == [line for line in shown.splitlines() if line.strip()], \
            f"{name}: it printed\n{stdout}\nand the page shows\n{shown}"
