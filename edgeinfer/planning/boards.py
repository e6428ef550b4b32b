"""Board profiles: schema, loading of packaged boards/*.yaml, user files, plugin boards, `host`.

Every numeric fact is ``{value, source, uncertain}``. Unknown keys and missing fields are
errors naming the file and the key.
"""

from __future__ import annotations

import difflib
import os
import platform
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from edgeinfer.contract.names import HOST_BACKEND, HOST_SCHEMES_SOURCE
from edgeinfer.errors import BoardError, InputError

GIB = 2**30
HOST_SPEED_GROUP = "host-cpu"  # the host board's speed constants (docs/planner.md#host-decode)
HOST_FITTED_ON = ("x86_64", "amd64")  # the architecture of bench/data/rows_host*.yaml's machine
# the host's llama.cpp runtime (decoders; built by the backend that declares it its own, Decoders.builds)
LLAMACPP_SOURCE = ("https://github.com/ggml-org/llama.cpp/blob/master/tools/quantize/README.md (F32, F16, Q8_0, "
                   "Q4_K_M, Q4_0 on CPU)")
# the host's openvino-cpu runtime (decoders; built by the backend that declares it its own, Decoders.builds)
OPENVINO_CPU_SOURCE = ("the plugin's CPU build (fp32, fp16, w8a16 in int8 blocks of 256): speed and overhead fitted "
                       "on bench/data/rows_host_openvino.yaml (bench/planner_host_openvino.py), "
                       "docs/board-facts.md#openvino-cpu-overhead")


def boards_dirs() -> list[Path]:
    """Where packaged board profiles live (source tree, or `edgeinfer/_boards` in a wheel)."""
    here = Path(__file__).resolve().parents[1]
    out, seen = [], set()
    for d in (here / "_boards", here.parent / "boards"):  # _boards: in a wheel (a symlink in the source tree)
        if d.is_dir() and d.resolve() not in seen:
            seen.add(d.resolve())
            out.append(d)
    return out


class Fact(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: float = Field(ge=0)
    source: str = Field(min_length=3)
    uncertain: bool = False
    note: str | None = None


class SpeedConst(BaseModel):
    """Decode: 1/(t0 + bytes_per_token / min(bw_cap_gbps, bw_fraction × bandwidth)) (planning.speed);
    prefill: TTFT = prefill_t0_ms + prompt × 2 × params / (prefill_factor × peak) (planning.prefill).
    ``error_pct``/``error_basis``: the error bar plan prints with them."""

    model_config = ConfigDict(extra="forbid")
    t0_ms: float = Field(ge=0)
    bw_fraction: float = Field(gt=0, le=1.5)
    bw_cap_gbps: float | None = Field(default=None, gt=0)
    prefill_factor: float | None = Field(default=None, gt=0)
    prefill_t0_ms: float | None = Field(default=None, ge=0)
    source: str = "board profile"
    error_pct: float | None = Field(default=None, ge=0)
    error_basis: str | None = None


class Runtime(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schemes: list[str] = Field(min_length=1)
    source: str = Field(min_length=3)
    kinds: list[Literal["decoder", "encoder"]] = ["decoder", "encoder"]
    max_context: int | None = Field(default=None, gt=0)
    speed_group: str | None = None  # key into the fitted speed constants (edgeinfer/data/speed_constants.json)
    speed: dict[str, SpeedConst] = {}  # inline constants per weight format, override the fitted ones
    overhead_mib: Fact | None = None  # runtime memory overhead on this board (a calibration), overrides runtimes.yaml
    notes: list[str] = []

    def overhead(self) -> dict | None:
        return self.overhead_mib.model_dump() if self.overhead_mib else None

    @field_validator("schemes")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        from edgeinfer.contract.schemes import normalize_scheme

        return [normalize_scheme(s).name for s in v]


class Board(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    title: str
    family: str
    backend: str
    memory_kind: Literal["shared", "dedicated"]
    chips: int = Field(default=1, ge=1)
    memory_total_gib: Fact
    os_reserve_gib: Fact
    bandwidth_gbps: Fact | None = None
    int8_tops: Fact | None = None
    fp16_tflops: Fact | None = None
    storage_gbps: Fact | None = None
    npu_window_gib: Fact | None = None  # largest contiguous NPU buffer (RK3588 IOMMU window)
    paging: bool = False
    runtimes: dict[str, Runtime] = Field(min_length=1)
    default_runtime: str
    backend_runtime: str | None = None  # the runtime edgeinfer's own backend uses here (deploy plans with it)
    target: str | None = None  # what the backend compiles for (rknn: rk3588; openvino: npu); default: family
    notes: list[str] = []
    calibration: dict | None = None  # `edgeinfer calibrate`: parent board, rows fitted on, per-row errors
    origin: str = "packaged"  # where the profile was loaded from (set by the loader)

    @field_validator("default_runtime")
    @classmethod
    def _rt(cls, v, info):
        rts = info.data.get("runtimes") or {}
        if rts and v not in rts:
            raise ValueError(f"default_runtime '{v}' is not one of the runtimes {sorted(rts)}")
        return v

    @field_validator("backend_runtime")
    @classmethod
    def _brt(cls, v, info):
        rts = info.data.get("runtimes") or {}
        if v is not None and rts and v not in rts:
            raise ValueError(f"backend_runtime '{v}' is not one of the runtimes {sorted(rts)}")
        return v

    @property
    def total_bytes(self) -> int:
        return int(self.memory_total_gib.value * GIB)

    @property
    def reserve_bytes(self) -> int:
        return int(self.os_reserve_gib.value * GIB)

    @property
    def usable_bytes(self) -> int:
        return self.total_bytes - self.reserve_bytes

    def supported_schemes(self, runtime: str | None = None) -> list[str]:
        if runtime:
            return list(self.runtimes[runtime].schemes)
        out: list[str] = []
        for r in self.runtimes.values():
            out += [s for s in r.schemes if s not in out]
        return out


def _format_validation(e: ValidationError, where: str) -> str:
    parts = []
    errs = sorted(e.errors(), key=lambda x: {"extra_forbidden": 0, "missing": 1}.get(x["type"], 2))
    for err in errs[:4]:
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif err["type"] == "missing":
            msg = "missing required key"
        parts.append(f"{loc}: {msg}")
    return f"{where}: invalid board profile: " + "; ".join(parts)


def board_from_dict(data: dict, where: str) -> Board:
    if not isinstance(data, dict):
        raise BoardError(f"{where}: a board profile must be a YAML mapping")
    try:
        return Board.model_validate(data)
    except ValidationError as e:
        raise BoardError(_format_validation(e, where), "see docs/planner.md for the board schema") from None
    except InputError as e:  # unknown scheme inside a runtime
        raise BoardError(f"{where}: {e.one_line()}") from None


def safe_loader() -> type:
    """PyYAML's safe loader on its C parser where PyYAML was built with it (the same data as ``yaml.safe_load``,
    several times faster: the packaged profiles and runtimes.yaml are read on every ``plan``)."""
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_board_file(path: Path) -> Board:
    import yaml

    try:
        data = yaml.load(Path(path).read_text(encoding="utf-8"), Loader=safe_loader())  # noqa: S506 - safe loader
    except OSError as e:
        raise BoardError(f"{path}: cannot read board file ({e.strerror})") from None
    except UnicodeDecodeError:
        raise BoardError(f"{path}: not a YAML text file (not UTF-8)", "pass a board profile YAML") from None
    except yaml.YAMLError as e:
        raise BoardError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    b = board_from_dict(data, str(path))
    b.origin = str(path)
    return b


def meminfo() -> tuple[int, int]:
    """(MemTotal, MemAvailable) in bytes from /proc/meminfo, or sysconf as a fallback."""
    try:
        vals = {}
        with open("/proc/meminfo") as f:
            for line in f:
                k, v = line.split(":", 1)
                vals[k] = int(v.split()[0]) * 1024
        return vals["MemTotal"], vals.get("MemAvailable", vals.get("MemFree", 0))
    except (OSError, KeyError, ValueError):
        pass
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
        return total, avail
    except (ValueError, OSError, AttributeError):
        raise BoardError("cannot measure this machine's memory", "pass a board profile with --board FILE") from None


def host_speed_group() -> str:
    """``host-cpu`` on an x86-64 machine, where the host rows were measured; elsewhere (an AArch64 board) a group of
    its own with no rows, so that the planner labels the x86 constants there extrapolated, error bar widened."""
    arch = platform.machine().lower()
    return HOST_SPEED_GROUP if arch in HOST_FITTED_ON else f"{HOST_SPEED_GROUP}-{arch or 'unknown'}"


def host_board(bandwidth=None) -> Board:
    """The machine edgeinfer runs on: total and available memory measured now, memory bandwidth measured once
    and cached (:mod:`edgeinfer.planning.host_bandwidth`; ``bandwidth``: a HostBandwidth to use instead)."""
    from edgeinfer.planning.host_bandwidth import host_bandwidth

    group = host_speed_group()
    total, avail = meminfo()
    src = "measured at run time from /proc/meminfo (MemTotal, MemAvailable)"
    bw = bandwidth or host_bandwidth()
    return Board(
        name="host", title=f"this machine ({os.cpu_count()} CPUs)", family="host", backend=HOST_BACKEND,
        memory_kind="shared",
        memory_total_gib=Fact(value=total / GIB, source=src),
        os_reserve_gib=Fact(value=max(0, total - avail) / GIB, source=src,
                            note="memory already in use by other processes (MemTotal - MemAvailable)"),
        bandwidth_gbps=Fact(value=bw.gbps, source=bw.source, uncertain=True,
                            note="one-thread copy bandwidth; the speed constants are fractions of it"),
        runtimes={HOST_BACKEND: Runtime(
            schemes=["fp32", "fp16", "w8a8", "w8a16", "w4a16", "w4a8", "w4a16_g128", "w4a8_g128"],
            speed_group=group, source=HOST_SCHEMES_SOURCE),
            "llama.cpp": Runtime(schemes=["fp16", "fp32", "gguf:Q8_0", "gguf:Q4_K_M", "gguf:Q4_0", "gguf:Q4_1"],
                                 kinds=["decoder"],
                                 speed_group=group, source=LLAMACPP_SOURCE),
            "openvino-cpu": Runtime(schemes=["fp32", "fp16", "w8a16"], kinds=["decoder"],
                                    speed_group=group, source=OPENVINO_CPU_SOURCE)},
        default_runtime=HOST_BACKEND,
        notes=[f"decode speed: constants {HOST_SPEED_GROUP}/{HOST_BACKEND}/<format> fitted by bench/fit_speed.py "
               "on bench/data/rows_host.yaml (bench/planner_host_llm.py), as fractions of the measured bandwidth"
               + ("" if group == HOST_SPEED_GROUP else
                  f"; measured on an x86-64 CPU, so on this {platform.machine()} machine extrapolated")],
        origin="measured",
    )


PLUGIN_BOARD_ERRORS: list[str] = []  # one line per plugin-provided profile that failed validation


def _plugin_boards() -> list:
    items: list = []
    try:  # the core's plugin manager; never fatal
        from edgeinfer.contract import registry as plugins  # noqa: PLC0415

        items += [b for b, _info in plugins.registry().boards()]
    except Exception:  # a broken plugin must not break planning
        pass
    return items


def _coerce(item, where: str) -> Board:
    if isinstance(item, Board):
        return item
    if isinstance(item, dict):
        return board_from_dict(item, where)
    return load_board_file(Path(item))


@lru_cache(maxsize=8)
def _packaged(family: str | None = None) -> dict[str, Board]:
    """Every packaged profile; with ``family``, those of that family only: a file whose text does not contain
    the family's name cannot be of it, and is not parsed (each profile parsed and validated costs ~2 ms)."""
    out: dict[str, Board] = {}
    for d in boards_dirs():
        for p in sorted(d.glob("*.yaml")):
            if family is not None and family not in p.read_text(encoding="utf-8", errors="replace"):
                continue
            b = load_board_file(p)
            b.origin = "packaged"
            if b.name != p.stem:
                raise BoardError(f"{p}: board name '{b.name}' does not match the file name '{p.stem}'")
            out.setdefault(b.name, b)
    return out


def load_boards(extra: Iterable = (), plugins: bool = True, family: str | None = None) -> dict[str, Board]:
    """Packaged boards, then plugin boards, then ``extra`` (later names override earlier ones); with ``family``,
    only the boards of that family."""
    out: dict[str, Board] = dict(_packaged(family))
    if plugins:
        for item in _plugin_boards():
            try:
                b = _coerce(item, "plugin board")
            except BoardError as e:  # a broken plugin profile must not break every plan
                PLUGIN_BOARD_ERRORS.append(e.one_line())
                continue
            b.origin = "plugin"
            out[b.name] = b
    for item in extra:
        b = _coerce(item, "extra board")
        out[b.name] = b
    return out if family is None else {k: b for k, b in out.items() if b.family == family}


def board_names(extra: Iterable = ()) -> list[str]:
    return sorted([*load_boards(extra), "host"])


def get_board(name_or_path, extra: Iterable = ()) -> Board:
    """A board by name, a path to a YAML profile, or a Board; unknown names list the closest ones."""
    if isinstance(name_or_path, Board):
        return name_or_path
    text = str(name_or_path).strip()
    if text == "host":
        return host_board()
    if text.endswith((".yaml", ".yml")) or os.sep in text:
        p = Path(text).expanduser()
        if not p.is_file():
            raise BoardError(f"board file '{text}' does not exist", "pass a board name or a YAML profile path")
        return load_board_file(p)
    extra = list(extra)
    if not extra:
        for d in boards_dirs():  # fast path: one packaged file
            p = d / f"{text}.yaml"
            if p.is_file():
                b = load_board_file(p)
                b.origin = "packaged"
                return b
    boards = load_boards(extra)
    if text in boards:
        return boards[text]
    low = text.lower()
    if low in boards:
        return boards[low]
    names = [*boards, "host"]
    close = difflib.get_close_matches(low, names, n=4, cutoff=0.4)
    if not close:
        close = [n for n in names if n.split("-")[0] in low][:4]
    hint = ("closest: " + ", ".join(close)) if close else "run `edgeinfer boards` for the list"
    raise BoardError(f"unknown board '{text}'", hint)


def board_summary(b: Board) -> dict:
    """One row of `edgeinfer boards`: the facts that tell boards apart (``boards show`` has them all)."""
    return {"name": b.name, "title": b.title, "family": b.family, "backend": b.backend,
            "memory_gib": b.memory_total_gib.value, "usable_gib": round(b.usable_bytes / GIB, 2),
            "bandwidth_gbps": b.bandwidth_gbps.value if b.bandwidth_gbps else None,
            "runtimes": {k: v.schemes for k, v in b.runtimes.items()}, "origin": b.origin}


def board_summaries() -> list[dict]:
    """Every board (packaged, from plugins, then ``host``) as a :func:`board_summary`."""
    return [board_summary(b) for b in [*load_boards().values(), host_board()]]
