"""The RKNN decoder artifact: ``convert_decoder`` writes a directory of static graphs plus the host's part.

Layout::

    rknn-decoder.json          manifest: scheme, target, context, prefill chunk, decode batches, model shape,
                               segments
    host.npz                   embedding table (fp16: what the NPU input receives), rotary cos/sin tables
    seg<k>.decode.rknn         layers of segment k, one token of one sequence per call  (+ .src.*/.log/stamp)
    seg<k>.decode<B>.rknn      the same layers, one token of each of B sequences per call (convert option
                               ``decode_batches``, e.g. "1,4,8"; 1 is always built)
    seg<k>.prefill.rknn        the same layers, ``prefill_chunk`` tokens of one sequence per call
    seg<k>.rknn.src.weights    the weights of segment k's source ONNX files, once for all its graphs
                               (:mod:`.shared_weights`; the simulator rebuilds from them, a board needs none)

Segments follow ``numpy.array_split`` over the layers (first segments take the extra layer); the last
one holds the final norm and the head. ``weight_bytes`` per segment are measured on the exported graph:
float initializer elements × bytes per weight of the scheme (the embedding stays on the host).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.contract import CalibrationSet, normalize_scheme, remote_code
from edgeinfer.contract.helpers import inside, read_artifact_manifest
from edgeinfer.errors import InputError, ModelError

from . import decoder_segments as lx
from . import shared_weights
from . import toolkit as tk
from .targets import CONVERSION_DEFAULTS, DECODER_QUANT_OPTIONS, DEFAULT_PREFILL_CHUNK

MANIFEST = "rknn-decoder.json"
FORMAT = 1
BYTES_PER_WEIGHT = {"fp16": 2.0, "w8a8": 1.0, "w8a16": 1.0, "w4a16": 0.5}
PHASES = ("decode", "prefill")
CALIB_DECODE_STEPS = 4  # decode-graph samples per calibration text, at the positions after its prefill


def check_scheme(scheme: str, target: str) -> str:
    family = normalize_scheme(scheme).family
    if target not in tk.QUANT_SUPPORT:
        raise InputError(f"unknown RKNN target {target!r}; use one of: {', '.join(tk.QUANT_SUPPORT)}")
    allowed = [s for s in tk.supported_schemes(target) if s in BYTES_PER_WEIGHT]
    if family not in allowed:
        where = [t for t, s in tk.QUANT_SUPPORT.items() if family in s]
        extra = f" ({family} needs a {' or '.join(where)} target)" if where else ""
        raise InputError(f"{target} runs rknn decoders as {', '.join(allowed)}, not {family}{extra}")
    return family


def positive(name: str, value: Any, default: int) -> int:
    value = default if value is None else value
    try:
        v = int(value)
    except (TypeError, ValueError):
        v = 0
    if isinstance(value, bool) or v < 1 or str(v) != str(value).strip():
        raise InputError(f"{name} must be a positive integer, got {value!r}")
    return v


def graph_name(k: int, phase: str) -> str:
    return f"seg{k}.{phase}.rknn"


def decode_key(batch: int) -> str:
    """The segment entry (and graph name part) of the decode graph of ``batch`` sequences."""
    return "decode" if batch == 1 else f"decode{batch}"


def parse_batches(value: Any) -> list[int]:
    """The ``decode_batches`` option ("1,4,8", a list of ints or one int) as a sorted list that holds 1."""
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, (list, tuple)) else [value]
    try:
        got = [int(str(x).strip()) for x in items]
    except ValueError:
        got = []
    if not got or any(b < 1 for b in got) or any(isinstance(x, (bool, float)) for x in items):
        raise InputError(f"decode_batches must be positive integers like 1,4,8, got {value!r}")
    return sorted({1, *got})


def graph_keys(manifest: dict[str, Any]) -> list[str]:
    """Every graph key of each segment entry: the decode graph of each built batch, then prefill."""
    return [decode_key(b) for b in manifest.get("decode_batches", [1])] + ["prefill"]


def read_manifest(path: Path) -> dict[str, Any] | None:
    """The artifact's manifest when ``path`` is an artifact directory, else None; the graph files it names
    must lie inside ``path``."""
    manifest = read_artifact_manifest(path, MANIFEST, FORMAT, "rknn decoder")
    if manifest is not None:
        segments = manifest.get("segments")
        if not isinstance(segments, list) or not segments or not all(isinstance(s, dict) for s in segments):
            raise ModelError(f"{Path(path) / MANIFEST} lists no segments; convert the model again")
        for k, seg in enumerate(segments):
            for key in graph_keys(manifest):
                inside(path, seg.get(key), f"{MANIFEST} segments[{k}].{key}")
    return manifest


def onnx_weight_elements(path: Path) -> int:
    import onnx

    proto = onnx.load(str(path), load_external_data=False)  # dims only: the shared weights file is not read
    return sum(int(np.prod(i.dims)) for i in proto.graph.initializer if i.data_type in (1, 10, 11, 16))


def convert_decoder(backend: Any, model: Path, scheme: str, context: int, out: Path,
                    calibration: Sequence[str] | None = None, **options: Any) -> dict[str, Any]:
    """Export and convert every segment graph of ``model`` into ``out``; return stamp facts."""
    target = str(options.get("target") or "rk3588").lower()
    family = check_scheme(scheme, target)
    chunk = min(positive("prefill_chunk", options.get("prefill_chunk"), DEFAULT_PREFILL_CHUNK), context)
    batches = parse_batches(options.get("decode_batches") or [1])
    quantized = family != "fp16"
    if quantized and not calibration:
        raise InputError(f"rknn {family} decoders need calibration text: pass --calib FILE.txt (one sample a line)")
    _check_quant_options(options, quantized)
    hf = lx.load_hf(Path(model))
    shape = lx.shape_of(hf)
    ranges = lx.segment_ranges(shape.layers, positive("segments", options.get("segments"), 1))
    tables = lx.host_tables(hf, context)
    calib = CalibrationFeeds(hf, model, ranges, chunk, context, tables, calibration) if quantized else None
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / "host.npz", embed=tables["embed"].astype(np.float16), cos=tables["cos"], sin=tables["sin"])
    given = {o: options[o] for o in DECODER_QUANT_OPTIONS if o in options}
    extra = {"auto_hybrid": True, **given} if quantized else {}  # every int8 graph: auto-hybrid and the options given
    segments = []
    with tempfile.TemporaryDirectory(prefix="edgeinfer-rknn-llm-") as tmp:
        for k, (a, b) in enumerate(ranges):
            entry: dict[str, Any] = {"layers": [a, b]}
            store = shared_weights.Store(Path(tmp) / f"seg{k}.rknn{shared_weights.SUFFIX}")
            for key, batch, tokens in [*((decode_key(n), n, 1) for n in batches), ("prefill", 1, chunk)]:
                onnx_path = Path(tmp) / f"seg{k}.{key}.onnx"
                lx.export_segment(hf, a, b, tokens, context, onnx_path, batch)
                store.take(onnx_path)
                if key == "decode":
                    entry["weight_bytes"] = int(onnx_weight_elements(onnx_path) * BYTES_PER_WEIGHT[family])
                sets = calib.for_graph(k, key, batch) if calib else None
                art = backend.quantize(onnx_path, scheme, sets, out / graph_name(k, key), target=target, **extra)
                keep_built(art)
                entry[key] = art.name
            store.path.replace(out / store.path.name)  # what the graphs' .src.onnx files point at
            segments.append(entry)
    manifest = {"format": FORMAT, "kind": "rknn-decoder", "scheme": scheme, "target": target, "context": context,
                "prefill_chunk": chunk, "prefill_logits": CONVERSION_DEFAULTS["prefill_logits"],
                "decode_batches": batches, "shape": shape.to_json(), "segments": segments,
                "calibration_texts": len(calibration or []) if quantized else 0}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return {"target": target, "prefill_chunk": chunk, "segments": len(segments), "decode_batches": batches,
            "max_slots": batches[-1], "segment_weight_bytes": [s["weight_bytes"] for s in segments]}


def _check_quant_options(options: dict[str, Any], quantized: bool) -> None:
    """Before any export: the int8 options only with an int8 scheme, and a cosine threshold in (0, 1]."""
    given = [o for o in DECODER_QUANT_OPTIONS if o in options]
    if given and not quantized:
        raise InputError(f"{', '.join(given)} apply to quantized schemes only (w8a8, w4a16)")
    if "auto_hybrid_cos_thresh" in options:
        try:
            ok = 0 < float(options["auto_hybrid_cos_thresh"]) <= 1
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise InputError(f"auto_hybrid_cos_thresh must be a number above 0 and at most 1, got "
                             f"{options['auto_hybrid_cos_thresh']!r}")


# --- calibration: segment inputs from text, through the same graphs in torch (fp32) -------------------
class CalibrationFeeds:
    """For each calibration text: one prefill chunk from position 0 and a few decode steps after it,
    run through the torch twin of every segment graph; the inputs each graph saw are its samples."""

    def __init__(self, hf: Any, model_dir: Path, ranges: list[tuple[int, int]], chunk: int, context: int,
                 tables: dict[str, np.ndarray], texts: Sequence[str]):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=remote_code.allowed(model_dir))
        self.hf, self.ranges, self.chunk, self.context, self.tables = hf, ranges, chunk, context, tables
        self.samples: dict[tuple[int, str], list[dict[str, np.ndarray]]] = {}
        for text in texts:
            ids = [i for i in tok(text)["input_ids"] if i is not None][: context - CALIB_DECODE_STEPS - 1]
            if ids:
                self._record(ids)

    def for_graph(self, k: int, key: str, batch: int = 1) -> CalibrationSet:
        """The samples of segment ``k``'s graph ``key``; for a batched decode graph, the decode samples
        stacked ``batch`` rows at a time (cycled when there are fewer)."""
        samples = self.samples.get((k, "decode" if key.startswith("decode") else key), [])
        if batch == 1 or not samples:
            return CalibrationSet(samples)
        count = max(1, len(samples) // batch)
        rows = [samples[i % len(samples)] for i in range(count * batch)]
        return CalibrationSet([{name: np.concatenate([r[name] for r in rows[j:j + batch]]) for name in rows[0]}
                               for j in range(0, len(rows), batch)])

    def _record(self, ids: list[int]) -> None:
        shape = lx.shape_of(self.hf)
        kv = np.zeros((shape.layers, 2, shape.kv_heads, self.context, shape.head_dim), np.float32)
        n = min(len(ids), self.chunk)
        logits = self._step(kv, ids[:n], 0, self.chunk, "prefill")
        pos = n
        for _ in range(CALIB_DECODE_STEPS):
            nxt = int(np.argmax(logits))
            logits = self._step(kv, [nxt], pos, 1, "decode")
            pos += 1

    def _step(self, kv: np.ndarray, ids: list[int], pos: int, tokens: int, phase: str) -> np.ndarray:
        import torch

        from .decoder import step_inputs

        hidden, cos, sin, mask = step_inputs(self.tables, ids, pos, tokens, self.context)
        out = hidden
        for k, (a, b) in enumerate(self.ranges):
            feeds = {f"hidden_{a}": out, "cos": cos, "sin": sin, "mask": mask}
            for i in range(a, b):
                feeds[f"past_k_{i}"], feeds[f"past_v_{i}"] = kv[i, 0][None], kv[i, 1][None]
            self.samples.setdefault((k, phase), []).append({name: v.copy() for name, v in feeds.items()})
            module = lx.torch_segment(self.hf, a, b, tokens)
            with torch.no_grad():
                res = module(*[torch.from_numpy(np.ascontiguousarray(feeds[x])) for x in lx.input_names(a, b)])
            out = res[0].numpy()
            for j, i in enumerate(range(a, b)):
                kv[i, 0, :, pos:pos + len(ids)] = res[1 + 2 * j][0, :, tokens - len(ids):].numpy()
                kv[i, 1, :, pos:pos + len(ids)] = res[2 + 2 * j][0, :, tokens - len(ids):].numpy()
        return out[0, -1]


# --- in-process hand-over of freshly built graphs (the simulator rebuilds anything else) --------------
_BUILT: dict[str, Any] = {}


def keep_built(art: Path) -> None:
    """Take the toolkit's just-built object for ``art`` so that opening the decoder in this process
    does not rebuild it; all graphs of a conversion are kept until opened (tk keeps only one)."""
    from edgeinfer.contract import stamp

    sha = stamp.sha256_file(art)
    rknn = tk.take_built(art, sha)
    if rknn is not None:
        _BUILT[f"{art.name}:{sha}"] = rknn  # by name: a cache entry moves into place after the build


def hand_over(art: Path) -> None:
    """Put a kept object back where the backend's simulator open looks for it."""
    from edgeinfer.contract import stamp

    sha = stamp.sha256_file(art)
    rknn = _BUILT.pop(f"{art.name}:{sha}", None)
    if rknn is not None:
        tk._BUILT[(str(art.resolve()), sha)] = rknn
