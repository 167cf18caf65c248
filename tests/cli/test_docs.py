"""The docs against the program: every option docs/CLI.md and README.md name exists in the
command's `--help`, and every option a command's `--help` lists is documented in CLI.md, so
neither can drift from the other (one place per fact: the option tables)."""
import os
import re
import subprocess

import pytest

CLI = os.environ.get("SHARDFEED_CLI", "shardfeed")
SOURCE = os.environ.get("SHARDFEED_SOURCE_DIR",
                        os.path.join(os.path.dirname(__file__), "..", ".."))
COMMANDS = ["pack", "verify", "inspect", "extract", "stats", "bench", "tune", "convert", "merge"]
FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")


def read(name):
    with open(os.path.join(SOURCE, name), encoding="utf-8") as f:
        return f.read()


def help_flags(command):
    p = subprocess.run([CLI, command, "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    flags = set(re.findall(r"^  (?:-\w \[ )?--([a-z0-9-]+)", p.stdout, re.M))
    assert flags, p.stdout
    return flags


@pytest.fixture(scope="module")
def helps():
    return {c: help_flags(c) for c in COMMANDS}


def cli_md_sections():
    """{command: text of its '## command ...' section}, and the text before the first one
    (what every command shares)."""
    text = read("docs/CLI.md")
    parts = re.split(r"^## ", text, flags=re.M)
    sections = {}
    for part in parts[1:]:
        command = part.split()[0]
        assert command in COMMANDS, "CLI.md has a section for an unknown command: " + command
        sections[command] = part
    return parts[0], sections


def test_every_option_cli_md_names_exists_in_that_commands_help(helps):
    common, sections = cli_md_sections()
    assert set(sections) == set(COMMANDS), set(COMMANDS) ^ set(sections)
    shared = set(FLAG.findall(common)) - {"version"}
    for command in COMMANDS:
        missing = shared - helps[command]
        assert not missing, ("CLI.md says every command takes", command, missing)
    for command, text in sections.items():
        missing = set(FLAG.findall(text)) - helps[command]
        assert not missing, (command, "CLI.md names options its --help lacks", sorted(missing))


def test_every_option_in_help_is_documented_in_cli_md(helps):
    common, sections = cli_md_sections()
    shared = set(FLAG.findall(common))
    loader = set(FLAG.findall(sections["bench"]))  # tune takes the loader options as bench does
    for command in COMMANDS:
        documented = shared | set(FLAG.findall(sections[command]))
        if command == "tune":
            documented |= loader & helps["bench"]
        missing = helps[command] - documented
        assert not missing, (command, "--help lists options CLI.md does not document",
                             sorted(missing))


def test_version_is_documented_and_works():
    common, _ = cli_md_sections()
    assert "--version" in common
    p = subprocess.run([CLI, "--version"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.startswith("shardfeed "), p.stdout


def test_every_option_readme_names_exists(helps):
    """README's command lines (`shardfeed CMD ... --flag`), `--sweep NAME=...` names, and the
    Python keywords it names (`run_ahead=False`, Loader(...) arguments): each one a real option
    of that command, or of the loader (Python keywords are the loader flags' snake_case)."""
    text = read("README.md")
    checked = 0
    for m in re.finditer(r"shardfeed (pack|verify|inspect|extract|bench|tune|convert|merge)"
                         r"\b([^\n`]*)", text):
        command, rest = m.group(1), m.group(2).split("#")[0]
        for flag in FLAG.findall(rest):
            assert flag in helps[command], (m.group(0), flag)
            checked += 1
        for spec in re.findall(r"--sweep ((?:\w+=\S+ ?)+)", rest):
            for name in re.findall(r"(\w+)=", spec):
                assert name.replace("_", "-") in helps["bench"], (m.group(0), name)
    loader = {f.replace("-", "_") for f in helps["bench"]}
    names = set(re.findall(r"`([a-z_]+)=[^`\s]+`", text))
    for call in re.findall(r"shardfeed(?:\.torch)?\.Loader\(([^)]*(?:\([^)]*\)[^)]*)*)\)", text):
        names |= set(re.findall(r"([a-z_]+)=", call))
    assert {"run_ahead", "batch_size", "crop", "mean"} <= names, names
    unknown = names - loader
    assert not unknown, ("README names Python keywords the loader lacks", sorted(unknown))
    assert checked >= 20, checked


def test_readme_states_the_padding_rule_for_uneven_ranks():
    text = read("README.md")
    assert re.search(r"world_size", text) and re.search(r"pad", text, re.I), \
        "README's distributed section must state how uneven ranks are padded"
