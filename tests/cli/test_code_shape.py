"""The code's shape (the project's guide): no C/C++ source under a src/ folder (or cli/) over 700
lines and no function over 100 lines unless a reason is written beside it. scripts/code_shape.py
does the counting; this runs it on the repository and checks that it finds what it must."""
import os
import subprocess
import sys

SOURCE = os.environ.get("SHARDFEED_SOURCE_DIR",
                        os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(SOURCE, "scripts", "code_shape.py")


def shape(root):
    return subprocess.run([sys.executable, SCRIPT, str(root)], capture_output=True, text=True,
                          timeout=120)


def test_the_repository_keeps_its_shape():
    p = shape(SOURCE)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout == "", p.stdout


def body(n):
    return "".join(f"  x += {i};  // {{ not a brace\n" for i in range(n))


def test_a_long_function_without_a_reason_is_named_and_with_one_is_not(tmp_path):
    src = tmp_path / "lib" / "src"
    src.mkdir(parents=True)
    (src / "a.cpp").write_text(
        "namespace n {\n"
        "struct S {\n  int Member() {\n" + body(99) + "    return 0;\n  }\n};\n"
        "Foo::Foo(int a) : a_{a}, s_(\"}\") {\n" + body(120) + "}\n"
        "// Why it is long.\n// long: one table.\nint Table() {\n" + body(150) + "}\n"
        "template <class T>\nT Short(T t) {\n  return t;\n}\n"
        "}  // namespace n\n")
    p = shape(tmp_path)
    assert p.returncode == 1, p.stdout
    lines = p.stdout.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("lib/src/a.cpp:3: function Member is 102 lines"), lines
    assert lines[1].startswith("lib/src/a.cpp:106: function Foo::Foo is 122 lines"), lines


def test_a_long_file_needs_its_reason(tmp_path):
    src = tmp_path / "cli"
    src.mkdir()
    text = "int f() {\n  return 1;\n}\n" * 240  # 720 lines of short functions
    (src / "main.cpp").write_text(text)
    p = shape(tmp_path)
    assert p.returncode == 1 and p.stdout.startswith("cli/main.cpp:1: file is 720 lines"), p.stdout
    (src / "main.cpp").write_text("// long file: one command table.\n" + text)
    p = shape(tmp_path)
    assert p.returncode == 0, p.stdout
