"""scripts/check-modules.sh on planted crates: each import cycle and each
unexplained long function fails it, and what is neither passes.

    python3 -m pytest -q scripts/tests
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "check-modules.sh"


def plant(root, files):
    """A crate under `root` with `files` ({path under src/: text})."""
    (root / "Cargo.toml").write_text(
        '[package]\nname = "planted"\nversion = "0.1.0"\nedition = "2024"\n[workspace]\n')
    for path, text in files.items():
        (root / "src" / path).parent.mkdir(parents=True, exist_ok=True)
        (root / "src" / path).write_text(text)
    return root


def check(root, *args):
    env = dict(os.environ, CHECK_MODULES_CRATE=str(root), CARGO_TARGET_DIR=str(root / "target"))
    for name in ("RUSTC_WORKSPACE_WRAPPER", "CLIPPY_ARGS", "CARGO_BUILD_RUSTFLAGS", "RUSTFLAGS"):
        env.pop(name, None)
    done = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True)
    return done.returncode, done.stdout + done.stderr


# (name, files, the cycle it must report or None)
CYCLES = [
    ("two top-level modules name each other",
     {"lib.rs": "mod a;\nmod b;\n", "a.rs": "use crate::b::B;\npub struct A;\n",
      "b.rs": "pub struct B;\nfn f() -> crate::a::A { crate::a::A }\n"},
     "a <-> b"),
    ("siblings in a folder, through super:: and a braced use",
     {"lib.rs": "mod x;\n", "x/mod.rs": "mod c;\nmod d;\n",
      "x/c.rs": "use super::{d::D};\npub struct C;\n", "x/d.rs": "pub fn f() -> super::c::C { todo!() }\n"},
     "c <-> d"),
    ("a sibling named through the parent's re-export",
     {"lib.rs": "mod x;\n", "x/mod.rs": "mod c;\nmod d;\npub use c::C;\n",
      "x/c.rs": "use crate::x::d::D;\npub struct C;\n", "x/d.rs": "use super::C;\npub struct D;\n"},
     "c <-> d"),
    ("a subfolder taken whole, reached from an inline test module",
     {"lib.rs": "mod x;\nmod y;\n", "x/mod.rs": "mod deep;\n", "x/deep.rs": "use crate::y::Y;\n",
      "y.rs": "pub struct Y;\n#[cfg(test)]\nmod tests {\n    use super::super::x;\n}\n"},
     "x <-> y"),
    ("no cycle: parent and child, comments and strings, other crates",
     {"lib.rs": "mod a;\nmod b;\npub struct Root;\n",
      "a.rs": "use crate::b::B;\nuse std::fmt;\nuse crate::Root;\n",
      "b.rs": "pub struct B;\n// crate::a::A\n/* use crate::a; */\nconst S: &str = \"crate::a::A\";\n"
              "const C: char = '\"';\nconst R: &str = r#\"super::a\"#;\n"},
     None),
]


@pytest.mark.parametrize("name,files,cycle", CYCLES, ids=[c[0] for c in CYCLES])
def test_import_cycles(tmp_path, name, files, cycle):
    status, out = check(plant(tmp_path, files), "--quiet", "--cycles-only")
    if cycle is None:
        assert status == 0, out
        assert "no import cycle" in out
    else:
        assert status == 1, out
        assert "CYCLE: " + cycle in out
        assert re.search(r"-> \w+  \(.*src/.*\.rs:\d+\)", out), "where each edge comes from"


def long_function(lines, expect=None):
    attribute = '#[expect(clippy::too_many_lines, reason = "%s")]\n' % expect if expect else ""
    body = "".join("    let x%d = %d;\n    std::hint::black_box(x%d);\n" % (i, i, i)
                   for i in range(lines // 2))
    return "%spub fn long() {\n%s}\n" % (attribute, body)


def crate_with(tmp_path, function):
    """A crate under this repository's clippy.toml and src/lib.rs's lint levels."""
    shutil.copy(REPO / "clippy.toml", tmp_path / "clippy.toml")
    levels = re.findall(r"^#!\[(?:warn|deny)\(clippy::[^\]]*\]$",
                        (REPO / "src" / "lib.rs").read_text(), re.M)
    assert any("too_many_lines" in level for level in levels), "src/lib.rs turns the lint on"
    return plant(tmp_path, {"lib.rs": "\n".join(levels) + "\n\n" + function})


@pytest.mark.skipif(shutil.which("cargo") is None, reason="needs cargo and clippy")
@pytest.mark.parametrize("function,passes", [
    (long_function(80), True),
    (long_function(82), False),
    (long_function(82, expect="one table, one row per rule"), True),
    (long_function(20, expect="stale: the function was split"), False),
], ids=["80 lines in its body", "82 without a reason", "82 with a reason", "a stale reason"])
def test_long_functions(tmp_path, function, passes):
    status, out = check(crate_with(tmp_path, function), "--quiet")
    assert (status == 0) == passes, out
    if not passes:
        assert "too_many_lines" in out or "unfulfilled_lint_expectations" in out, out
