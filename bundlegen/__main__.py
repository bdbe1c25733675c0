"""`python -m bundlegen`: the CLI. From a checkout that is not installed it says, in one
line, how to install: the repository's top-level folders (harness, engines, ...) become
subpackages of `bundlegen` only through the install's package-dir mapping, so a plain
checkout can import `bundlegen` but none of the commands."""
import importlib.util
import sys

#: a subpackage only an install maps into `bundlegen` (the router itself imports it lazily)
MAPPED_SUBPACKAGE = "bundlegen.harness"
NOT_INSTALLED = ("error: bundlegen is not installed in this Python (a checkout's folders become its "
                 "subpackages only when installed): run `pip install -e .` in the repository "
                 "(`bash scripts/test.sh` makes .venv with it), then `source .venv/bin/activate`")


def installed() -> bool:
    try:
        return importlib.util.find_spec(MAPPED_SUBPACKAGE) is not None
    except ModuleNotFoundError:
        return False


if __name__ == "__main__":
    if not installed():
        print(NOT_INSTALLED, file=sys.stderr)
        sys.exit(2)
    from bundlegen.cli import main

    sys.exit(main())
