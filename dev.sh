#!/usr/bin/env bash
# Set-up and entry point for a fresh machine.
#   bash dev.sh demo   -> create .venv (Python >= 3.12), install shardwise, run the demo
#   bash dev.sh test   -> the same set-up, then the whole test suite (lint, types, pytest)
#   bash dev.sh docs   -> the same set-up, then the documentation site into docs/_build/html
#   bash dev.sh bench-page [--quick|--tiny] -> the same set-up, then benchmarks/page.py: the
#                         benchmarks side by side with their peers, written into docs/benchmarks.md
#   bash dev.sh mutate [MODULE...] -> the same set-up plus mutmut (the `mutate` extra), then the
#                         mutation-testing lane (mutation/run.py; not part of CI)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
venv="${SHARDWISE_VENV:-$here/.venv}"

say() { echo "dev.sh: $*" >&2; }

works() { "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1; }

find_python() {
    local c
    for c in "${PYTHON:-}" python3.13 python3.12 python3; do
        [ -n "$c" ] && command -v "$c" >/dev/null 2>&1 && works "$c" && { command -v "$c"; return; }
    done
    # pyenv installs whose shims refuse to run unless selected
    if command -v pyenv >/dev/null 2>&1; then
        local root; root="$(pyenv root)"
        for c in $(ls -d "$root"/versions/3.1[3-9]* "$root"/versions/3.12* 2>/dev/null | sort -rV); do
            works "$c/bin/python3" && { echo "$c/bin/python3"; return; }
        done
    fi
    echo "shardwise needs Python >= 3.12; set PYTHON=/path/to/python3.12+" >&2
    exit 1
}

zarrs_req="zarrs>=0.2.3,<0.3"
aqz_req="acquire-zarr>=0.10,<0.11"

setup() {
    local stamp="$venv/.shardwise-installed" py
    if [ ! -x "$venv/bin/python" ] || ! works "$venv/bin/python"; then
        rm -rf "$venv"
        py="$(find_python)"
        say "creating the virtual environment $venv with $py ($("$py" --version 2>&1))"
        "$py" -m venv "$venv"
    fi
    say "Python: $venv/bin/python ($("$venv/bin/python" --version 2>&1))"
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
        say "installing shardwise and its test dependencies into $venv (about 2 minutes)"
        "$venv/bin/python" -m pip install -q --upgrade pip
        "$venv/bin/python" -m pip install -q -e ".[test]"
        touch "$stamp"
        say "installed; use it with $venv/bin/python (or: source $venv/bin/activate)"
    else
        say "shardwise is installed in $venv (pyproject.toml unchanged since)"
    fi
    # zarrs (zarr-python's Rust codec pipeline) beside the venv, not in it: once installed its
    # entry point loads its library into every process that imports zarr (about 9 MiB), which
    # the memory tests would count; tests/write/test_rectilinear_appends.py runs it in a child
    # process with this directory on PYTHONPATH
    if [ ! -f "$venv/side/zarrs/.installed" ]; then
        say "installing zarrs beside the venv ($venv/side/zarrs)"
        rm -rf "$venv/side/zarrs"
        "$venv/bin/python" -m pip install -q --no-deps --target "$venv/side/zarrs" "$zarrs_req"
        touch "$venv/side/zarrs/.installed"
    fi
}

cmd="${1:-}"; shift || true
case "$cmd" in
    demo)
        setup
        say "running examples/demo.py"
        exec "$venv/bin/python" examples/demo.py "$@" ;;
    test)
        setup
        say "lint: ruff check"
        "$venv/bin/ruff" check src tests benchmarks examples
        say "format: ruff format --check"
        "$venv/bin/ruff" format --check src tests benchmarks examples
        say "types: mypy"
        "$venv/bin/mypy"
        # two worker processes, each test file whole in one worker (tests/README.md "Test order
        # and workers"); `bash dev.sh test -n 0 ...` runs in one process
        say "tests: pytest -n 2 --dist loadfile $*"
        exec "$venv/bin/python" -m pytest -n 2 --dist loadfile --durations=40 "$@" ;;
    docs)
        setup
        # the whole site (pages, guides, API reference, command line); warnings are errors
        # (numpydoc's validation of the public verbs, a broken link or reference included);
        # --keep-going lists them all before failing
        say "docs: sphinx-build -W --keep-going docs docs/_build/html"
        exec "$venv/bin/python" -m sphinx -W --keep-going -b html docs docs/_build/html "$@" ;;
    bench-page)
        setup
        if ! "$venv/bin/python" -c 'import zarrista' >/dev/null 2>&1; then
            say "installing the compared libraries (the bench extra) into $venv"
            "$venv/bin/python" -m pip install -q -e ".[test,bench]"
        fi
        # acquire-zarr (a compared streaming writer) beside the venv, as zarrs (pip --target,
        # no dependencies: installing it into the venv conflicts with the project's pins);
        # benchmarks/page.py hands the directory to stream.py (AQZ_PATH). If it cannot be
        # installed, the page lists it as absent.
        if [ ! -f "$venv/side/acquire-zarr/.installed" ]; then
            say "installing acquire-zarr beside the venv ($venv/side/acquire-zarr)"
            rm -rf "$venv/side/acquire-zarr"
            if "$venv/bin/python" -m pip install -q --no-deps --target "$venv/side/acquire-zarr" "$aqz_req"; then
                touch "$venv/side/acquire-zarr/.installed"
            else
                rm -rf "$venv/side/acquire-zarr"
                say "acquire-zarr could not be installed: the page lists it as absent"
            fi
        fi
        say "benchmarks: benchmarks/page.py $* (the page: docs/benchmarks.md)"
        exec "$venv/bin/python" benchmarks/page.py "$@" ;;
    mutate)
        setup
        if ! "$venv/bin/python" -c 'import mutmut' >/dev/null 2>&1; then
            say "installing mutmut (the mutate extra) into $venv"
            "$venv/bin/python" -m pip install -q -e ".[test,mutate]"
        fi
        say "mutation testing: mutation/run.py $* (one module at a time, one child process)"
        exec "$venv/bin/python" mutation/run.py "$@" ;;
    *)
        echo "usage: bash dev.sh demo|test|docs|bench-page|mutate [args]" >&2; exit 2 ;;
esac
