"""Measured rows for `edgeinfer calibrate`: read, check and normalise.

A row has the fields of bench/data/measured_rows.yaml: board, runtime, model, quant, prompt, ctx,
decode (tokens/s), ttft_ms, mem_mib (peak memory, MiB), mem_ctx (the context memory was measured at,
when it differs from ctx), source_id (the publication, for leave-one-source-out), bandwidth_gbps (the
board's bandwidth when the row was measured: the host board's is measured per machine), runtime_version (the
runtime release, commit or date the row was measured with: decode speed changes between releases).
Sources: YAML (a ``rows:`` list or a bare list), CSV with a header line,
JSON (such a list, or an ``edgeinfer bench --json`` report of a decoder bundle, whose ``self_check.rows``
are rows). A row may carry ``model_config`` (the model's config.json) so that it plans without the model.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from edgeinfer.errors import InputError

REQUIRED = ("model", "quant", "ctx", "decode")
INTS = ("prompt", "ctx", "mem_ctx")
FLOATS = ("decode", "ttft_ms", "mem_mib", "bandwidth_gbps")
KNOWN = {"row", "grade", "board", "runtime", "runtime_version", "model", "model_name", "model_config", "quant",
         "prompt", "ctx", "mem_ctx", "decode", "prefill", "ttft_ms", "mem_mib", "fit", "source", "source_id", "note",
         "new_tokens", "backend", "device", "predicted", "error_pct", "bandwidth_gbps",
         "mem_fit"}  # mem_fit: false: the peak is measured but not fitted on (bench/fit_speed.py)
HINT = "give rows with model, quant, ctx and decode (tokens/s) as in bench/data/measured_rows.yaml, " \
       "or an `edgeinfer bench --json` report of a decoder bundle"


def _parse(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(f"{path}: cannot read measurements ({e.strerror})", "pass an existing file") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a text file (not UTF-8)", HINT) from None
    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            return list(csv.DictReader(text.splitlines()))
        if suffix == ".json":
            return json.loads(text)
        if suffix in (".yaml", ".yml"):
            import yaml

            return yaml.safe_load(text)
    except (ValueError, csv.Error) as e:
        raise InputError(f"{path}: not valid {suffix[1:].upper()} ({str(e).splitlines()[0]})", HINT) from None
    except Exception as e:  # yaml.YAMLError without importing yaml at module level
        raise InputError(f"{path}: not valid YAML ({str(e).splitlines()[0]})", HINT) from None
    raise InputError(f"{path}: unknown measurements format '{suffix}'", "pass .yaml, .yml, .csv or .json")


def _rows_of(data: Any, path: Path) -> list[Any]:
    if isinstance(data, dict) and data.get("kind") == "decoder":  # an `edgeinfer bench --json` report
        sc = data.get("self_check")
        if not isinstance(sc, dict) or not isinstance(sc.get("rows"), list):
            raise InputError(f"{path}: this bench report has no self-check rows",
                             "bench a decoder bundle (deployed for a board) with this edgeinfer version")
        return sc["rows"]
    if isinstance(data, dict) and isinstance(data.get("rows"), list):
        return data["rows"]
    if isinstance(data, list):
        return data
    raise InputError(f"{path}: no measurement rows found", HINT)


def _number(v: Any, key: str, where: str, integer: bool) -> float | int:
    if isinstance(v, str):
        v = v.strip()
        try:
            v = int(v) if integer else float(v)
        except ValueError:
            raise InputError(f"{where}: '{key}' must be a {'whole ' if integer else ''}number, got {v!r}",
                             HINT) from None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise InputError(f"{where}: '{key}' must be a positive number, got {v!r}", HINT)
    if integer and v != int(v):
        raise InputError(f"{where}: '{key}' must be a whole number, got {v!r}", HINT)
    return int(v) if integer else float(v)


def check_row(raw: Any, where: str) -> dict[str, Any]:
    """One row with its numbers checked (positive, finite); empty CSV cells count as absent."""
    if not isinstance(raw, dict):
        raise InputError(f"{where}: a measurement row must be a mapping of field → value, got {type(raw).__name__}",
                         HINT)
    row = {k: v for k, v in raw.items() if v is not None and v != ""}
    unknown = sorted(set(row) - KNOWN)
    if unknown:
        raise InputError(f"{where}: unknown field '{unknown[0]}'", "fields: " + ", ".join(sorted(KNOWN)))
    missing = [k for k in REQUIRED if k not in row]
    if missing:
        raise InputError(f"{where}: missing '{missing[0]}'", HINT)
    for k in INTS + FLOATS:
        if k in row:
            row[k] = _number(row[k], k, where, k in INTS)
    for k in ("model", "quant", "board", "runtime"):
        if k in row and not isinstance(row[k], str):
            raise InputError(f"{where}: '{k}' must be text, got {row[k]!r}", HINT)
    if "model_config" in row and not isinstance(row["model_config"], dict):
        raise InputError(f"{where}: 'model_config' must be the model's config.json object", HINT)
    if "prompt" in row and row["prompt"] > row["ctx"]:
        raise InputError(f"{where}: prompt {row['prompt']} is longer than ctx {row['ctx']}",
                         "ctx is the tokens in the KV cache during decode: prompt + generated")
    row["where"] = where
    return row


def load(paths: list[Path]) -> tuple[list[dict[str, Any]], list[str]]:
    """Every usable row of ``paths`` and notes on what was skipped (rows marked ``fit: false``)."""
    if not paths:
        raise InputError("no measurements given", HINT)
    rows, notes = [], []
    for path in paths:
        found = _rows_of(_parse(Path(path)), Path(path))
        for i, raw in enumerate(found, 1):
            where = f"{path} row {raw.get('row', i) if isinstance(raw, dict) else i}"
            if isinstance(raw, dict) and raw.get("fit") is False:
                notes.append(f"{where}: skipped (fit: false)")
                continue
            rows.append(check_row(raw, where))
    if not rows:
        raise InputError(f"no measurement rows in {', '.join(str(p) for p in paths)}", HINT)
    return rows, notes
