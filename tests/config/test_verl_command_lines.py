"""verl's own FSDP launch command lines must load unchanged; Megatron ones must be refused clearly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.config import ConfigError, load_config, parse_command_line
from hybridflow.config.loader import canonical_key

DATA = Path(__file__).parent / "data" / "verl_command_lines.txt"


def sections():
    out, name, args = [], None, []
    for line in DATA.read_text().splitlines():
        if line.startswith("## "):
            if name:
                out.append((name, args))
            name, args = line[3:].strip(), []
        elif line.strip() and not line.startswith("#"):
            args.append(line.strip())
    out.append((name, args))
    return out


ACCEPT = [s for s in sections() if not s[0].startswith("refuse:")]
REFUSE = [s for s in sections() if s[0].startswith("refuse:")]


@pytest.mark.parametrize("name,args", ACCEPT, ids=[s[0] for s in ACCEPT])
def test_verl_fsdp_command_line_loads(name, args):
    cl = parse_command_line(args)
    cfg = load_config(cl.overrides, cl.config_path, cl.config_name)
    for arg in cl.overrides:  # every override is visible in the typed config (under its current name)
        key = canonical_key(arg.lstrip("+").partition("=")[0])
        obj = cfg
        for part in key.split("."):
            obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)


@pytest.mark.parametrize("name,args", REFUSE, ids=[s[0] for s in REFUSE])
def test_megatron_command_lines_are_refused(name, args):
    cl = parse_command_line(args)
    with pytest.raises(ConfigError) as e:
        load_config(cl.overrides, cl.config_path, cl.config_name)
    assert "not supported" in str(e.value) and ("FSDP2" in str(e.value) or "fsdp2" in str(e.value))


def test_one_script_through_the_console_script():
    name, args = ACCEPT[0]
    out = subprocess.run([sys.executable, "-m", "hybridflow", "train", "--dry-run", *args],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "dry run: configuration is valid" in out.stdout
