"""The C agent's sources (collectors/c): laid out as its .clang-format says, and built with warnings
as errors whatever CFLAGS make is given."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from support.common import ROOT, needs

C_DIR = ROOT / "collectors" / "c"
CLANG_FORMAT = Path(shutil.which("clang-format") or "/usr/bin/clang-format")


def make(*args: str, cwd: Path = C_DIR) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(cwd), *args], capture_output=True, text=True, timeout=300
    )


@needs(CLANG_FORMAT)
def test_c_sources_are_laid_out_as_clang_format_says():
    out = make("format-check")
    assert out.returncode == 0, out.stdout + out.stderr
    # every source and header, the fuzzers' included
    checked = set(out.stdout.split())
    assert {str(p.relative_to(C_DIR)) for p in (*C_DIR.glob("agent/*.[ch]"), *C_DIR.glob("fuzz/*.c"))} <= checked


@needs(CLANG_FORMAT)
def test_the_format_check_refuses_a_source_laid_out_otherwise(tmp_path):
    for name in (".clang-format", "Makefile"):
        shutil.copy(C_DIR / name, tmp_path / name)
    for folder in ("agent", "fuzz"):
        shutil.copytree(C_DIR / folder, tmp_path / folder, ignore=shutil.ignore_patterns("corpus"))
    fuzzer = tmp_path / "fuzz" / "fuzz_stat.c"
    fuzzer.write_text(fuzzer.read_text() + "static int  badly_laid_out( void ) { return 0; }\n")
    out = make("format-check", cwd=tmp_path)
    assert out.returncode != 0 and "fuzz/fuzz_stat.c" in out.stderr, out.stdout + out.stderr


def test_every_build_of_the_agent_treats_warnings_as_errors():
    """Even when CFLAGS, given to make, says otherwise: the agent, its ASan build and the fuzzers."""
    out = make("-n", "-B", "CFLAGS=-O2 -Wno-error", "all", "asan", "fuzz")
    assert out.returncode == 0, out.stderr
    compiles = [line.split() for line in out.stdout.splitlines() if " -o build/" in line and ".c" in line]
    outputs = {words[words.index("-o") + 1] for words in compiles}
    fuzzers = {f"build/{p.stem}" for p in C_DIR.glob("fuzz/fuzz_*.c")}
    assert {"build/flowstat-agent", "build/flowstat-agent-asan", *fuzzers} <= outputs, outputs
    for words in compiles:
        assert {"-Wall", "-Wextra"} <= set(words), words
        errors = [w for w in words if w in ("-Werror", "-Wno-error")]
        assert errors and errors[-1] == "-Werror", words
