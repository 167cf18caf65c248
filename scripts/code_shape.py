#!/usr/bin/env python3
"""The code's shape, as the project's guide asks: no C/C++ source file over 700 lines and no
function over 100 lines unless a reason is written beside it. Python 3 standard library only.

Scanned: every C/C++ source (.c .cc .cpp .cu .h .hpp .cuh) under a top-level folder's src/
(base/src, reader/src, python/src: the bindings, ...) and under cli/.

The reason, when a long one is meant to stay long:
  - a function: a comment line `// long: <reason>` in the comment block right above it (above
    its template line, if any);
  - a file: a line `// long file: <reason>` among its first 30 lines.

Usage: code_shape.py [ROOT]   (ROOT: the repository, default: this script's parent folder)
Prints one line per finding ("path:line: function NAME is N lines, ..."); exit 0 when every
long one has its reason, 1 otherwise.

Limits of the heuristic (it matches braces, it does not parse C++):
  - comments, string and character literals (raw strings too) and preprocessor lines are
    blanked first; a macro that opens or closes a brace on its own confuses the count;
  - a block is a function when the text before its `{` (back to the previous `;`, `{` or `}`)
    holds a `(` and is not a namespace, class, struct, union or enum head; braces of a
    constructor's initializer list (`: a_{x}, b_{y} {`) are skipped;
  - lambdas and local classes count toward the function they are in; a lambda at namespace
    scope counts as a function; functions defined in a class body count as functions;
  - a function's lines run from the first line of its head to its closing brace.
"""
import os
import re
import sys

MAX_FILE_LINES = 700
MAX_FUNCTION_LINES = 100
EXTENSIONS = (".c", ".cc", ".cpp", ".cu", ".h", ".hpp", ".cuh")
FILE_REASON = re.compile(r"^\s*//\s*long file:\s*\S")
FUNCTION_REASON = re.compile(r"^\s*//\s*long:\s*\S")
TYPE_HEAD = re.compile(r"^(template\s*<.*?>\s*)?(class|struct|union|enum)\b", re.S)
NAMESPACE_HEAD = re.compile(r"^(inline\s+)?namespace\b|^extern\s+\"C\"")
CTOR_INIT = re.compile(r"\)\s*(?:noexcept\s*)?:(?!:)")


def sources(root):
    folders = [os.path.join(root, d, "src") for d in sorted(os.listdir(root))]
    folders.append(os.path.join(root, "cli"))
    for folder in folders:
        if not os.path.isdir(folder):
            continue
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames.sort()
            for name in sorted(filenames):
                if name.endswith(EXTENSIONS):
                    yield os.path.join(dirpath, name)


def blank(text):
    """The text with comments, literals and preprocessor lines turned to spaces (newlines
    kept, so offsets and line numbers still match)."""
    out = list(text)
    i, n = 0, len(text)
    line_start = True

    def wipe(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if line_start and c == "#":
            j = i
            while j < n and text[j] != "\n":
                j += 2 if text[j] == "\\" and j + 1 < n else 1
            # Comments inside a preprocessor line end with it (good enough here).
            wipe(i, j)
            i = j
            continue
        if c == "\n":
            line_start = True
            i += 1
            continue
        if not c.isspace():
            line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            wipe(i, j)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            wipe(i, j)
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum()
                                                                        or text[i - 1] == "_")):
            m = re.match(r'R"([^()\\\s]{0,16})\(', text[i:])
            if not m:
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i + m.end())
            j = n if end < 0 else end + len(m.group(1)) + 2
            wipe(i, j)
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and (text[i - 1].isalnum()):  # a digit separator: 1'000
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            wipe(i, min(j + 1, n))
            i = j + 1
        else:
            i += 1
    return "".join(out)


def functions(text):
    """(name, first line, last line) of each function definition (1-based lines)."""
    code = blank(text)
    line_of = []
    line = 1
    for ch in code:
        line_of.append(line)
        line += ch == "\n"
    found = []
    stack = []  # per open brace: ("function" | "type" | "namespace" | "other", head start)
    head_start = 0
    i, n = 0, len(code)
    while i < n:
        c = code[i]
        if c == ";":
            head_start = i + 1
        elif c == "{":
            head = code[head_start:i].strip()
            in_function = any(kind == "function" for kind, _ in stack)
            if (not in_function and CTOR_INIT.search(head) and
                    re.search(r"[\w>]\s*$", code[head_start:i])):
                # A member's brace initializer in a constructor's initializer list: skip it.
                depth, j = 0, i
                while j < n:
                    depth += {"{": 1, "}": -1}.get(code[j], 0)
                    if depth == 0:
                        break
                    j += 1
                i = j + 1
                continue
            if in_function:
                kind = "other"
            elif NAMESPACE_HEAD.match(head):
                kind = "namespace"
            elif TYPE_HEAD.match(head):
                kind = "type"
            elif "(" in head:
                kind = "function"
            else:
                kind = "other"
            start = head_start
            while start < i and code[start].isspace():
                start += 1
            stack.append((kind, start))
            head_start = i + 1
        elif c == "}":
            if stack:
                kind, start = stack.pop()
                if kind == "function":
                    head = code[start:code.find("{", start)]
                    names = re.findall(r"([~\w:]+(?:operator\s*\S+?)?)\s*\(", head)
                    name = names[0] if names else "?"
                    found.append((name, line_of[start], line_of[i]))
            head_start = i + 1
        i += 1
    return found


def reason_above(lines, first):
    """True when the comment block right above line `first` (1-based) gives a reason."""
    k = first - 2
    while k >= 0 and lines[k].strip().startswith("template"):
        k -= 1
    while k >= 0 and lines[k].strip().startswith("//"):
        if FUNCTION_REASON.match(lines[k]):
            return True
        k -= 1
    return False


def check(path, rel):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    lines = text.split("\n")
    findings = []
    count = len(lines) - (1 if text.endswith("\n") else 0)
    if count > MAX_FILE_LINES and not any(FILE_REASON.match(x) for x in lines[:30]):
        findings.append(f"{rel}:1: file is {count} lines (over {MAX_FILE_LINES}) and gives no "
                        f"reason (a line '// long file: <reason>' among its first 30)")
    for name, first, last in functions(text):
        length = last - first + 1
        if length > MAX_FUNCTION_LINES and not reason_above(lines, first):
            findings.append(f"{rel}:{first}: function {name} is {length} lines (over "
                            f"{MAX_FUNCTION_LINES}) and gives no reason (a comment line "
                            f"'// long: <reason>' right above it)")
    return findings


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(
        __file__)))
    findings = []
    for path in sources(root):
        findings += check(path, os.path.relpath(path, root))
    for f in findings:
        print(f)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
