"""What scripts/install.sh asks Python: hvdkit's pins, and pip's settings passed on to uv.

    python3 scripts/installer.py pins                 # every pin, e.g. TORCH_VERSION=2.14.1, TORCH_CUDA_MAJOR=13
    python3 scripts/installer.py pins TORCH_VERSION   # one value
    python3 scripts/installer.py uv-env               # `export UV_...=` lines from `pip config list`

The pins are in two files, and this is their one reader (the shell scripts and the tests ask it):

- ``requirements.lock``: every package's exact version, transitive ones included, made by ``make lock``
  (``uv pip compile``) from pyproject.toml's dependencies; pip and uv read it as a constraints file.
  A package is NAME_VERSION here (upper case, '-' and '.' as '_', the '-cpu' flavour suffix dropped:
  tensorflow-cpu==2.21.0 is TENSORFLOW_VERSION).
- pyproject.toml's ``[tool.hvdkit]`` table: what a requirements file cannot say (Horovod, which is built
  from its sdist, the sdist's checksum, CUDA, the container engine). ``horovod-version`` is HOROVOD_VERSION.

uv reads none of pip's settings (pip.conf, PIP_* variables), so a machine whose pip is set up for a
mirror would see uv go to PyPI instead: ``uv-env`` passes on where pip finds packages.

Standard library only: install.sh runs this with the interpreter it is about to use, before any venv.
"""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
# A line as `uv pip compile` writes it: `name==version`, then ` ; marker` for some platforms only.
LOCKED = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)(?P<marker>\s*;.*)?$")


# What scripts/install.sh reads: each must be there.
REQUIRED = ("HOROVOD_VERSION", "HOROVOD_SDIST_SHA256", "TORCH_VERSION", "TORCH_CUDA_MAJOR", "KERAS_VERSION",
            "TENSORFLOW_VERSION", "GPU_CUDA_CC_LIST", "PYTHON_MIN", "PYTHON_MAX")


class PinsError(Exception):
    pass


def key(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).upper().removesuffix("_CPU")


def locked_versions(text: str) -> dict[str, str]:
    """``requirements.lock``'s unconditional pins by key; a package pinned only for some platforms is left out."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = LOCKED.match(line)
        if m and not m["marker"]:
            out[key(m["name"]) + "_VERSION"] = m["version"]
    return out


def pins(root: Path = ROOT) -> dict[str, str]:
    try:
        import tomllib
    except ImportError:                 # Python 3.10 (install.sh refuses it later, naming the versions): pip's copy
        try:
            from pip._vendor import tomli as tomllib
        except ImportError:
            raise PinsError(f"Python {sys.version.split()[0]} is too old for hvdkit (it needs 3.11 or newer): "
                            "install python3.11 and set HVDKIT_PYTHON=python3.11") from None
    for path in (root / "pyproject.toml", root / "requirements.lock"):
        if not path.is_file():
            raise PinsError(f"{path} is missing: restore it from git (git checkout -- {path.name})")
    table = tomllib.loads((root / "pyproject.toml").read_text()).get("tool", {}).get("hvdkit")
    if not table:
        raise PinsError("pyproject.toml has no [tool.hvdkit] table: restore it (git checkout -- pyproject.toml)")
    found = {**locked_versions((root / "requirements.lock").read_text()), **{key(k): str(v) for k, v in table.items()}}
    missing = [k for k in REQUIRED if k not in found]
    if missing:
        raise PinsError(f"no pin {', '.join(missing)} in requirements.lock or pyproject.toml's [tool.hvdkit]: "
                        "restore both from git, or run make lock after editing pyproject.toml")
    return found


# pip's option -> uv's variables. Lists: pip separates them with spaces or lines, uv's UV_FIND_LINKS with commas.
UV_FROM_PIP = {"index-url": ("UV_DEFAULT_INDEX",), "extra-index-url": ("UV_INDEX",), "find-links": ("UV_FIND_LINKS",),
               "trusted-host": ("UV_INSECURE_HOST",), "timeout": ("UV_HTTP_TIMEOUT",),
               "default-timeout": ("UV_HTTP_TIMEOUT",), "cert": ("SSL_CERT_FILE",),
               "proxy": ("HTTPS_PROXY", "HTTP_PROXY"), "no-cache-dir": ("UV_NO_CACHE",)}


def uv_env(pip_config_list: str) -> list[str]:
    r"""``export`` lines for uv from ``pip config list``'s output; as in pip, PIP_* variables win, then [install].

    >>> uv_env("global.extra-index-url='file:///a file:///b'\n:env:.find-links='/w /v'\nglobal.find-links='/x'")
    ["export UV_INDEX='file:///a file:///b'", 'export UV_FIND_LINKS=/w,/v']
    """
    rank = {":env:": 0, "install": 1, "global": 2}
    conf: dict[str, str] = {}
    for line in sorted(pip_config_list.splitlines(), key=lambda s: rank.get(s.split(".", 1)[0], 3)):
        name, _, value = line.partition("=")
        try:
            value = ast.literal_eval(value)      # pip prints each value as a Python literal ('\n'-joined lists too)
        except (ValueError, SyntaxError):
            pass
        conf.setdefault(name.split(".", 1)[-1], str(value))
    out, named = [], set()
    for option, names in UV_FROM_PIP.items():
        value = " ".join(conf.get(option, "").split())          # one line, spaces between list items
        for var in names:
            if value and var not in named:
                named.add(var)
                out.append(f"export {var}={shlex.quote(','.join(value.split()) if option == 'find-links' else value)}")
    return out


def main(argv: list[str]) -> int:
    command, args = (argv[0], argv[1:]) if argv else ("", [])
    if command == "uv-env":
        listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
        print("\n".join(uv_env(listed.stdout)))
        return 0
    if command != "pins":
        print("usage: installer.py pins [KEY...] | installer.py uv-env", file=sys.stderr)
        return 2
    try:
        found = pins()
    except PinsError as exc:
        print(f"hvdkit pins: error: {exc}", file=sys.stderr)
        return 1
    missing = [k for k in args if k not in found]
    if missing:
        print(f"hvdkit pins: error: no pin {', '.join(missing)} in requirements.lock or pyproject.toml's "
              "[tool.hvdkit]: restore them from git", file=sys.stderr)
        return 1
    print("\n".join(found[k] for k in args) if args else "\n".join(f"{k}={v}" for k, v in found.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
