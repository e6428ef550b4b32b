"""The Ascend environment doctor: pure functions over text, files and environment variables.

Nothing here imports torch or torch_npu and nothing here runs a command: the device module
(:mod:`edgeinfer_ascend.device`) gathers the raw facts (``npu-smi info`` text, the stderr of a
``python -c "import torch"`` subprocess, installed package versions) and these functions turn
them into :class:`~edgeinfer.contract.backend.Problem` entries with a concrete fix. Tests feed them
recorded outputs from public sources.
"""

from __future__ import annotations

import json
import os
import platform
import re
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from edgeinfer.contract import FreeMemory, Problem
from edgeinfer.errors import InputError

SET_ENV = "/usr/local/Ascend/ascend-toolkit/set_env.sh"
# where CANN installs by default (root; non-root uses $HOME/Ascend): old layout, then 8.5+ layout
DEFAULT_TOOLKIT_HOMES = (
    "/usr/local/Ascend/ascend-toolkit/latest",
    "/usr/local/Ascend/cann",
    "~/Ascend/ascend-toolkit/latest",
    "~/Ascend/cann",
)
TOOLKIT_ENV_VARS = ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")
CANN_LIBS = ("libascendcl.so", "libhccl.so")


# --- CANN toolkit ---------------------------------------------------------------------------


@dataclass
class Toolkit:
    home: str | None = None  # toolkit directory (ASCEND_TOOLKIT_HOME / ASCEND_HOME_PATH or default path)
    found_by: str = ""  # "env:ASCEND_TOOLKIT_HOME", "default path", ""
    version: str | None = None  # from <home>/<arch>-linux/ascend_toolkit_install.info
    version_file: str | None = None
    env_sourced: bool = False  # set_env.sh was sourced in this environment
    libs_on_path: dict[str, str | None] = field(default_factory=dict)  # lib -> dir on LD_LIBRARY_PATH

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def parse_install_info(text: str) -> dict[str, str]:
    """``key=value`` lines of ``ascend_toolkit_install.info`` (package_name, version, arch, path...)."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key:
            out[key.strip()] = value.strip()
    return out


def find_toolkit(env: Mapping[str, str] | None = None, arch: str | None = None) -> Toolkit:
    """Locate the CANN toolkit from the variables ``set_env.sh`` exports, else the default paths."""
    env = os.environ if env is None else env
    arch = arch or platform.machine()
    tk = Toolkit()
    for var in TOOLKIT_ENV_VARS:
        if env.get(var):
            tk.home, tk.found_by, tk.env_sourced = env[var], f"env:{var}", True
            break
    if tk.home is None:
        for cand in DEFAULT_TOOLKIT_HOMES:
            p = Path(os.path.expanduser(cand))
            if p.is_dir():
                tk.home, tk.found_by = str(p), "default path"
                break
    if tk.home:
        home = Path(tk.home)
        for info in (home / f"{arch}-linux" / "ascend_toolkit_install.info", home / "ascend_toolkit_install.info"):
            if info.is_file():
                try:
                    parsed = parse_install_info(info.read_text(errors="replace"))
                except OSError:
                    continue
                tk.version, tk.version_file = parsed.get("version"), str(info)
                break
        if tk.version is None:  # versioned install dirs: /usr/local/Ascend/ascend-toolkit/8.0.RC3
            m = re.search(r"(\d+\.\d+\.(?:RC\d+|\d+|T\d+)[\w.]*)",
                          str(home.resolve()) if home.exists() else str(home))
            if m:
                tk.version = m.group(1)
    dirs = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
    for lib in CANN_LIBS:
        tk.libs_on_path[lib] = next((d for d in dirs if (Path(d) / lib).exists()), None)
    return tk


def toolkit_problems(tk: Toolkit, npu_present: bool) -> list[Problem]:
    problems = []
    if tk.home is None:
        if npu_present:
            problems.append(
                Problem(
                    "CANN toolkit not found (no ASCEND_TOOLKIT_HOME / ASCEND_HOME_PATH, nothing under "
                    "/usr/local/Ascend)",
                    "install the CANN toolkit matching your driver (https://www.hiascend.com/cann), then "
                    f"`source {SET_ENV}`",
                )
            )
        return problems
    missing = [lib for lib, d in tk.libs_on_path.items() if d is None]
    if missing:
        script = str(Path(tk.home).parent / "set_env.sh") if tk.found_by == "default path" else SET_ENV
        problems.append(
            Problem(
                f"CANN is installed at {tk.home} but {', '.join(missing)} is not on LD_LIBRARY_PATH",
                f"`source {script}` in this shell (add it to ~/.bashrc to keep it)",
            )
        )
    return problems


# --- npu-smi info -----------------------------------------------------------------------------


@dataclass
class Chip:
    npu: int
    chip: int
    name: str
    health: str
    power_w: float | None
    temp_c: float | None
    aicore_pct: float | None
    bus_id: str
    memory_used_mb: int | None  # HBM where the card has it (910), else DDR Memory-Usage (310P)
    memory_total_mb: int | None
    memory_kind: str  # "HBM" or "DDR"
    phy_id: int | None = None


@dataclass
class NpuSmiInfo:
    version: str | None
    chips: list[Chip]
    processes: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


_PAIR = re.compile(r"(\d+)\s*/\s*(\d+)")


def _num(tok: str) -> float | None:
    try:
        return float(tok)
    except ValueError:
        return None  # "NA", "-"


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def parse_npu_smi_info(text: str) -> NpuSmiInfo:
    """Parse the table ``npu-smi info`` prints (310P, 910B, A3 layouts; narrow and wide).

    Each chip is two table rows: ``NPU Name | Health | Power Temp Hugepages`` then
    ``Chip [Phy-ID|Device] | Bus-Id | AICore Memory-Usage [HBM-Usage]``. Memory is the HBM pair
    where the header has an HBM column and that pair is non-zero, else Memory-Usage (DDR).
    """
    version = None
    m = re.search(r"npu-smi\s+(\S+)", text)
    if m:
        version = m.group(1)
    has_hbm = "HBM-Usage" in text
    chips: list[Chip] = []
    processes: list[dict[str, Any]] = []
    rows = [ln for ln in text.splitlines() if ln.strip().startswith("|")]
    in_procs = False
    pending: list[str] | None = None
    for line in rows:
        cells = _cells(line)
        joined = " ".join(cells)
        if "Process id" in joined:
            in_procs = True
            continue
        if in_procs:
            if len(cells) >= 4 and re.match(r"^\d+\s+\d+$", cells[0]):
                npu, chip = cells[0].split()
                processes.append(
                    {"npu": int(npu), "chip": int(chip), "pid": cells[1], "name": cells[2],
                     "memory_mb": _num(cells[3])}
                )
            continue
        if len(cells) < 3 or cells[0].startswith(("NPU", "Chip", "npu-smi")):
            continue
        if pending is None:
            first = cells[0].split()
            if len(first) >= 2 and first[0].isdigit():
                pending = cells
            continue
        top, bottom, pending = pending, cells, None
        npu_s, name = top[0].split(None, 1)
        t_fields = top[2].split()
        b_first = bottom[0].split()
        b_fields = bottom[2].split()
        pairs = [(int(a), int(b)) for a, b in _PAIR.findall(bottom[2])]
        mem_kind, used, total = "DDR", None, None
        if pairs:
            used, total = pairs[0]
        if has_hbm and len(pairs) >= 2 and pairs[1][1] > 0:
            mem_kind, (used, total) = "HBM", pairs[1]
        chips.append(
            Chip(
                npu=int(npu_s),
                chip=int(b_first[0]) if b_first and b_first[0].isdigit() else 0,
                phy_id=int(b_first[1]) if len(b_first) > 1 and b_first[1].isdigit() else None,
                name=name.strip(),
                health=top[1],
                power_w=_num(t_fields[0]) if t_fields else None,
                temp_c=_num(t_fields[1]) if len(t_fields) > 1 else None,
                aicore_pct=_num(b_fields[0]) if b_fields else None,
                bus_id=bottom[1],
                memory_used_mb=used,
                memory_total_mb=total,
                memory_kind=mem_kind,
            )
        )
    return NpuSmiInfo(version=version, chips=chips, processes=processes)


def npu_smi_problems(info: NpuSmiInfo) -> list[Problem]:
    problems = []
    if not info.chips:
        problems.append(
            Problem(
                "npu-smi ran but listed no NPU chip",
                "check the driver with `npu-smi info` as root and `ls /dev/davinci*`; reinstall the Ascend driver "
                "and firmware if the devices are missing",
            )
        )
    for c in info.chips:
        if c.health.upper() != "OK":
            problems.append(
                Problem(
                    f"NPU {c.npu} chip {c.chip} ({c.name}) health is {c.health!r}",
                    f"run `npu-smi info -t health -i {c.npu} -c {c.chip}` for the alarm; reset with "
                    f"`npu-smi set -t reset -i {c.npu} -c {c.chip}` or reboot, and check the firmware version",
                )
            )
    return problems


# --- torch / torch_npu / CANN versions --------------------------------------------------------


@lru_cache(maxsize=1)
def compat_table() -> dict[str, Any]:
    return json.loads((Path(__file__).parent / "data" / "torch_npu_compat.json").read_text())


def _base(version: str) -> str:
    """'2.6.0.post3' -> '2.6.0'; '2.13.0+cpu' -> '2.13.0'."""
    m = re.match(r"(\d+\.\d+\.\d+)", version or "")
    return m.group(1) if m else (version or "")


def _norm_cann(version: str) -> str:
    v = version.strip().upper().removeprefix("CANN").strip()
    return v


def version_problems(torch_version: str | None, torch_npu_version: str | None,
                     cann_version: str | None) -> list[Problem]:
    """Check torch / torch_npu / CANN against the official table; name the matching pair on a mismatch."""
    if not torch_npu_version:
        return []
    problems = []
    rows = compat_table()["rows"]
    src = compat_table()["source_url"]
    npu_base = _base(torch_npu_version)
    if torch_version and _base(torch_version) != npu_base:
        problems.append(
            Problem(
                f"torch_npu {torch_npu_version} is built for torch {npu_base} but torch {torch_version} is installed",
                f"pip install torch=={npu_base} (or pip install torch_npu=={_base(torch_version)})",
            )
        )
    if cann_version:
        cann = _norm_cann(cann_version)
        exact = [r for r in rows if r["torch_npu"] == torch_npu_version]
        if exact and all(_norm_cann(r["cann"]) != cann for r in exact):
            for_cann = [r for r in rows if _norm_cann(r["cann"]) == cann]
            same_torch = [r for r in for_cann if r["torch"] == npu_base]
            if same_torch:
                fix = (f"pip install torch_npu=={same_torch[0]['torch_npu']} "
                       f"(the build for CANN {cann} and torch {npu_base})")
            elif for_cann:
                r = for_cann[0]
                fix = f"use torch=={r['torch']} with torch_npu=={r['torch_npu']} for CANN {cann}"
            else:
                fix = f"install CANN {exact[0]['cann']} for torch_npu {torch_npu_version}"
            wanted = ", ".join(sorted({r["cann"] for r in exact}))
            problems.append(
                Problem(
                    f"torch_npu {torch_npu_version} is made for CANN {wanted} but CANN {cann} is installed ({src})",
                    fix,
                )
            )
    return problems


def compat_status(torch_npu_version: str | None, cann_version: str | None) -> str:
    """'matches', 'mismatch', 'not in table' or 'unknown' (for the details of the probe)."""
    if not torch_npu_version or not cann_version:
        return "unknown"
    rows = [r for r in compat_table()["rows"] if r["torch_npu"] == torch_npu_version]
    if not rows:
        return "not in table"
    return "matches" if any(_norm_cann(r["cann"]) == _norm_cann(cann_version) for r in rows) else "mismatch"


# --- import failures --------------------------------------------------------------------------

_MISSING_LIB = re.compile(r"(lib[\w\-]+\.so[\w.]*): cannot open shared object file")


def import_problems(stderr: str, cann_home: str | None = None) -> list[Problem]:
    """Turn the stderr of a failed ``import torch`` / ``import torch_npu`` into problems with fixes."""
    problems = []
    if not stderr.strip():
        return problems
    libs = sorted(set(_MISSING_LIB.findall(stderr)))
    autoload = "Failed to load the backend extension: torch_npu" in stderr
    if autoload:
        problems.append(
            Problem(
                "torch_npu is installed but cannot load, and torch auto-loads it: `import torch` itself fails in "
                "this environment (every torch-based backend is broken, not only ascend)",
                "on a machine without an Ascend NPU: `pip uninstall torch_npu`; to keep it installed: "
                "`export TORCH_DEVICE_BACKEND_AUTOLOAD=0`; on an Ascend host: install CANN and "
                f"`source {SET_ENV}`",
            )
        )
    if libs:
        cann_libs = [lib for lib in libs
                     if lib.split(".so")[0] + ".so" in CANN_LIBS or "ascend" in lib or "hccl" in lib]
        where = f" (CANN found at {cann_home})" if cann_home else " (no CANN toolkit found)"
        problems.append(
            Problem(
                f"torch_npu cannot find {', '.join(libs)}{where}",
                f"`source {SET_ENV}` before starting Python" if cann_home or cann_libs else f"`source {SET_ENV}`",
            )
        )
    if not problems:
        last = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()][-1]
        problems.append(Problem(f"import torch / torch_npu failed: {last}",
                                "run `python -c 'import torch_npu'` to see the full error"))
    return problems


# --- device memory vs the plan ----------------------------------------------------------------

MIB = 2**20


def free_memory(info: NpuSmiInfo, index: int) -> FreeMemory | None:
    """What chip ``index`` (npu-smi's order) has free, as npu-smi reports it; None when it does not say.
    An index npu-smi does not list is an InputError naming the cards there are."""
    if index >= len(info.chips):
        raise InputError(f"npu-smi lists {len(info.chips)} NPU chip(s), none at index {index}",
                         "pick an existing card (ASCEND_RT_VISIBLE_DEVICES renumbers them from 0)")
    c = info.chips[index]
    if c.memory_total_mb is None or c.memory_used_mb is None:
        return None
    return FreeMemory((c.memory_total_mb - c.memory_used_mb) * MIB, f"NPU {c.npu} chip {c.chip} ({c.name})",
                      used_bytes=c.memory_used_mb * MIB, runtime="torch-npu")
