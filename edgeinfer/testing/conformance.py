"""The conformance kit: one test class every backend plugin runs against itself.

Usage, in a plugin's tests::

    from edgeinfer.testing import BackendConformance

    class TestMyNpuConformance(BackendConformance):
        backend_name = "mynpu"
        quantize_options = {"target": "rk3588"}   # passed to Backend.quantize
        pass_shapes = True                          # add shapes={input: shape} from the feeds
        board = "rk3588-8g"                         # deploy through this board profile (its backend: mynpu)

Known gaps are data on the Backend class (``tensors = Tensors(gaps={"dynamic_shapes": "why"})``);
the kit skips the matching cases with that reason. Gap keys: see ``GAP_KEYS``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import edgeinfer
from edgeinfer.contract import registry as plugins
from edgeinfer.contract import stamp
from edgeinfer.contract.backend import Backend, Probe, Profile, Session, validate_feeds, validate_outputs
from edgeinfer.contract.records import PagingLimit, Placement
from edgeinfer.errors import BackendError, FeedError, InputError
from edgeinfer.testing import models as kit_models

GAP_KEYS = {
    "dynamic_shapes": "a model with a symbolic batch dimension",
    "attention": "MatMul/Transpose/Softmax attention block",
    "int64_inputs": "int64 inputs (token ids)",
    "multiple_outputs": "two inputs and two outputs",
    "op_profile": "per-op times in profile()",
}
MODEL_NAMES = ("mlp", "mlp_dynamic", "attention", "embedding", "two_in_two_out")


class _Kit:
    """Converts each kit model once per test class and keeps at most one session open
    (some runtimes, like the RKNN simulator, hold one model per process)."""

    def __init__(self, suite: type[BackendConformance], backend: Backend, root: Path):
        self.suite, self.backend, self.root = suite, backend, root
        self.models = {m.name: m for m in kit_models.all_models(root / "models")}
        self.artifacts: dict[str, Path] = {}
        self.sources: dict[str, Path] = {}  # the file each model was converted from (.onnx, or .pt2)
        self._open: tuple[str, Session] | None = None
        self._segments: list[Path] | None = None

    @property
    def takes_pt2(self) -> bool:
        """Backends that convert torch.export programs, not ONNX, get the kit models as .pt2."""
        return "onnx" not in self.backend.tensors.sources and "pt2" in self.backend.tensors.sources

    def source(self, name: str) -> Path:
        if name not in self.sources:
            m = self.models[name]
            if self.takes_pt2:
                self.sources[name] = kit_models.export_pt2(m, self.root / "models")
            elif "onnx" in self.backend.tensors.sources:
                self.sources[name] = m.path
            else:
                pytest.skip(f"backend converts {self.backend.tensors.sources}; the kit has ONNX and .pt2 models")
        return self.sources[name]

    def gap(self, model: str) -> None:
        key = self.models[model].gap
        if key and key in self.backend.tensors.gaps:
            pytest.skip(f"declared gap {key}: {self.backend.tensors.gaps[key]}")

    def artifact(self, name: str) -> Path:
        if name not in self.artifacts:
            m = self.models[name]
            out = self.root / "artifacts" / (name + self.backend.tensors.native[0])
            self.artifacts[name] = self.backend.quantize(
                self.source(name), self.suite.scheme, None, out, **self.suite.options_for(m)
            )
        return self.artifacts[name]

    def session(self, name: str) -> Session:
        if self._open and self._open[0] == name and not self._open[1].closed:
            return self._open[1]
        self.close()
        s = self.backend.load(self.artifact(name), device=self.suite.device, **self.suite.load_options)
        self._open = (name, s)
        return s

    def segments(self) -> list[Path]:
        """A 6-block deep stack split into 3 segments, each converted by this backend (once per class)."""
        from edgeinfer.run.segments import deploy_segments

        if "onnx" not in self.backend.tensors.sources:
            pytest.skip(f"backend converts {self.backend.tensors.sources}; paged deploys split ONNX models")
        if self._segments is None:
            self.close()  # some runtimes hold one model per process
            model = kit_models.deep_stack(self.root / "deep.onnx", layers=6, batch=2)
            self._segments = deploy_segments(self.backend, model, self.root / "segments", self.suite.scheme, None,
                                             segments=3, **self.suite.quantize_options)
        return self._segments

    def paged(self, window: int = 2, prefetch: bool = True) -> Any:
        from edgeinfer.run.paged import PagedSession

        arts = self.segments()
        self.close()
        return PagedSession.from_artifacts(self.backend, arts, device=self.suite.device, window=window,
                                           prefetch=prefetch, **self.suite.load_options)

    def close(self) -> None:
        if self._open:
            self._open[1].close()
            self._open = None


class BackendConformance:
    backend_name: str = ""
    scheme: str | None = None  # None: the backend's default scheme
    device: str | None = None
    quantize_options: dict[str, Any] = {}
    load_options: dict[str, Any] = {}
    pass_shapes: bool = False  # static-shape toolkits: pass shapes={input: list(shape)} to quantize
    board: str | None = None  # a board profile (name or YAML path) whose backend is this one: the deploy case
    rtol: float = 1e-3
    atol: float = 1e-3

    @classmethod
    def options_for(cls, model: kit_models.KitModel) -> dict[str, Any]:
        opts = dict(cls.quantize_options)
        if cls.pass_shapes:
            opts["shapes"] = {k: list(v.shape) for k, v in model.feeds.items()}
        return opts

    @pytest.fixture(scope="class")
    @classmethod
    def backend(cls) -> Backend:
        plugins.reset()
        return edgeinfer.backend(cls.backend_name)

    @pytest.fixture(scope="class")
    @classmethod
    def kit(cls, backend: Backend, tmp_path_factory: pytest.TempPathFactory):
        k = _Kit(cls, backend, tmp_path_factory.mktemp(f"kit-{cls.backend_name}"))
        yield k
        k.close()

    # --- discovery and probe ----------------------------------------------------------------------

    def test_discovered_through_entry_point(self, backend: Backend) -> None:
        entry = plugins.registry().backends[self.backend_name]
        assert entry.plugin.distribution not in ("", "?"), "backend must come from an installed distribution"
        assert type(backend).name == self.backend_name
        assert plugins.contract_problem(type(backend)) is None
        for key in backend.tensors.gaps:
            assert key in GAP_KEYS, f"unknown gap key {key!r}; known: {sorted(GAP_KEYS)}"

    def test_probe_fields(self, backend: Backend) -> None:
        p = backend.probe()
        assert isinstance(p, Probe)
        assert isinstance(p.available, bool)
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in p.versions.items())
        assert all(isinstance(d, str) and d for d in p.devices)
        for problem in p.problems:
            assert problem.message.strip() and problem.fix.strip(), "every problem needs a concrete fix hint"
        if p.available:
            assert p.devices, "an available backend names at least one device"
        else:
            assert p.problems, "an unavailable backend says why"
        json.dumps(p.to_json())  # probes are reported as JSON

    # --- conversion and running ------------------------------------------------------------------

    @pytest.mark.parametrize("model", MODEL_NAMES)
    def test_run_matches_numpy_reference(self, kit: _Kit, model: str) -> None:
        kit.gap(model)
        m = kit.models[model]
        s = kit.session(model)
        assert [i.name for i in s.inputs] == list(m.feeds)
        want = m.reference(m.feeds)
        if kit.takes_pt2:  # torch.export programs carry no output names: match outputs by position
            want = dict(zip([o.name for o in s.outputs], want.values()))
        assert sorted(o.name for o in s.outputs) == sorted(want)
        got = s.run(m.feeds)
        assert sorted(got) == sorted(want)
        for name, ref in want.items():
            out = np.asarray(got[name])
            assert out.shape == ref.shape, f"{name}: shape {out.shape} != {ref.shape}"
            np.testing.assert_allclose(out.astype(np.float64), ref, rtol=self.rtol, atol=self.atol, err_msg=name)

    @pytest.mark.parametrize("model", MODEL_NAMES)
    def test_infer_returns_what_the_session_declares(self, kit: _Kit, model: str) -> None:
        """The core checks what ``Session.infer`` returns against ``Session.outputs`` (every declared name and no
        other, NumPy arrays of the declared dtype, rank and fixed dimensions) and refuses anything else as the
        plugin's failure: exit 3, "backend X failed: its session returned ..."."""
        kit.gap(model)
        s = kit.session(model)
        raw = s.infer(validate_feeds(s.inputs, kit.models[model].feeds))
        try:
            validate_outputs(s.outputs, raw, self.backend_name)
        except BackendError as e:
            pytest.fail(f"Session.infer does not return what Session.outputs declares: {e.one_line()}")

    def test_dynamic_batch_accepts_other_sizes(self, kit: _Kit) -> None:
        kit.gap("mlp_dynamic")
        m = kit.models["mlp_dynamic"]
        s = kit.session("mlp_dynamic")
        assert isinstance(s.inputs[0].shape[0], str) or s.inputs[0].shape[0] is None
        for n in (1, 5):
            x = np.random.default_rng(n).standard_normal((n, 16)).astype(np.float32)
            (got,) = s.run({"x": x}).values()
            np.testing.assert_allclose(got, m.reference({"x": x})["y"], rtol=self.rtol, atol=self.atol)

    # --- feed validation (owned by the core, so it must hold for every backend) -----------------------

    def test_unknown_input_is_named(self, kit: _Kit) -> None:
        feeds = dict(kit.models["mlp"].feeds, bogus=np.zeros(1, np.float32))
        with pytest.raises(FeedError, match="bogus"):
            kit.session("mlp").run(feeds)

    def test_missing_input_is_named(self, kit: _Kit) -> None:
        with pytest.raises(FeedError, match="'x'"):
            kit.session("mlp").run({})

    def test_wrong_dtype_says_expected_and_got(self, kit: _Kit) -> None:
        x = kit.models["mlp"].feeds["x"].astype(np.float64)
        with pytest.raises(FeedError, match="float32.*float64"):
            kit.session("mlp").run({"x": x})

    def test_wrong_shape_says_expected_and_got(self, kit: _Kit) -> None:
        x = np.zeros((2, 15), np.float32)
        with pytest.raises(FeedError, match=r"\[2, 16\].*\[2, 15\]"):
            kit.session("mlp").run({"x": x})

    # --- profile, close, stamps --------------------------------------------------------------------

    def test_profile_fields(self, kit: _Kit, backend: Backend) -> None:
        prof = kit.session("mlp").profile(kit.models["mlp"].feeds, repeat=5)
        assert isinstance(prof, Profile) and prof.runs == 5
        lat = prof.latency_ms
        assert 0 <= lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
        assert lat["min"] <= lat["mean"] <= lat["max"]
        assert prof.peak_memory_bytes and prof.peak_memory_bytes > 0
        json.dumps(prof.to_json())
        if "op_profile" not in backend.tensors.gaps:
            assert prof.ops, "no per-op times: declare the 'op_profile' gap if the SDK gives none"
            assert all(o.name and o.time_ms >= 0 for o in prof.ops)
            times = [o.time_ms for o in prof.ops]
            assert times == sorted(times, reverse=True), "ops must be slowest first"

    def test_close_and_reuse(self, kit: _Kit, backend: Backend) -> None:
        m = kit.models["mlp"]
        s = kit.session("mlp")
        first = s.run(m.feeds)
        s.close()
        s.close()  # idempotent
        assert s.closed
        with pytest.raises(InputError, match="closed"):
            s.run(m.feeds)
        with backend.load(kit.artifact("mlp"), device=self.device, **self.load_options) as again:
            second = again.run(m.feeds)
        assert again.closed
        for name in first:
            np.testing.assert_allclose(second[name], first[name], rtol=1e-6, atol=1e-6)

    def test_artifact_is_stamped(self, kit: _Kit, backend: Backend) -> None:
        kit.close()
        art = kit.artifact("mlp")
        data = stamp.read(art)
        assert data is not None, "quantize must leave a stamp next to the artifact"
        assert data["backend"] == self.backend_name
        assert data["scheme"] == (self.scheme or backend.tensors.default_scheme)
        assert [i["name"] for i in data["inputs"]] == ["x"]
        assert "toolkit" in data["versions"], "Backend.versions() must name the toolkit version"
        assert data["source"]["sha256"] == stamp.sha256_file(kit.source("mlp"))

    def test_load_refuses_foreign_stamp(self, kit: _Kit, backend: Backend, tmp_path: Path) -> None:
        kit.close()
        art = kit.artifact("mlp")
        copy = tmp_path / art.name
        copy.write_bytes(art.read_bytes())
        for extra in art.parent.glob(art.stem + ".*"):  # sidecars such as OpenVINO's .bin
            if extra != art and not extra.name.endswith(".stamp.json"):
                (tmp_path / extra.name).write_bytes(extra.read_bytes())
        data = stamp.read(art)
        stamp.stamp_path(copy).write_text(json.dumps(dict(data, backend="someone-else")))
        with pytest.raises(InputError, match="someone-else"):
            backend.load(copy, device=self.device, **self.load_options)
        # a release later than any installed one, which even a runtime that loads older releases' files refuses
        other = dict(data, versions=dict(data["versions"], toolkit="99999.0-not-installed"))
        stamp.stamp_path(copy).write_text(json.dumps(other))
        with pytest.raises(InputError, match="99999.0-not-installed"):
            backend.load(copy, device=self.device, **self.load_options)

    def test_quantize_rejects_unknown_scheme(self, kit: _Kit, backend: Backend, tmp_path: Path) -> None:
        with pytest.raises(InputError, match="w3a5"):
            backend.quantize(kit.models["mlp"].path, "w3a5", None, tmp_path / "x")

    def test_quantize_missing_model(self, backend: Backend, tmp_path: Path) -> None:
        with pytest.raises(InputError, match="not found"):
            backend.quantize(tmp_path / "nope.onnx", None, None, tmp_path / "out")

    def test_corrupt_model_is_a_clear_error(self, kit: _Kit, backend: Backend, tmp_path: Path) -> None:
        kit.close()
        bad = tmp_path / "corrupt.onnx"
        bad.write_bytes(b"\x08\x07garbage that is not a protobuf model" * 3)
        out = tmp_path / ("out" + backend.tensors.native[0])
        # a file the plugin cannot read is the user's: ModelError on purpose (exit 2), not "backend X failed" (3)
        with pytest.raises(InputError) as err:
            backend.quantize(bad, None, None, out, **self.quantize_options)
        line = err.value.one_line()
        assert "\n" not in line and "corrupt" in line, f"the error must name the file it could not read: {line}"
        assert not out.exists() and not stamp.stamp_path(out).exists(), "nothing half-written may remain"

    # --- the optional facts the core asks (docs/writing-a-backend.md) ----------------------------------
    def test_artifact_files_start_with_the_artifact_and_exist(self, kit: _Kit, backend: Backend) -> None:
        art = kit.artifact("mlp")
        files = backend.artifact_files(art)
        assert files[0] == art and all(f.is_file() for f in files), files
        assert not any(f.name.endswith(".stamp.json") for f in files), "the stamp is not part of the model"

    def test_simulation_files_lie_beside_the_artifact_and_spare_what_the_board_runs(self, kit: _Kit,
                                                                                    backend: Backend) -> None:
        """What ``deploy --board-only`` would leave out of a folder holding the artifact: files in that folder, never
        the artifact, its weight files or its stamp."""
        art = kit.artifact("mlp")
        named = backend.simulation_files(art.parent)
        runs = {f.resolve() for f in backend.artifact_files(art)} | {stamp.stamp_path(art).resolve()}
        for f in named:
            assert f.is_file() and f.resolve().is_relative_to(art.parent.resolve()), f"{f}: not a file in the folder"
            assert f.resolve() not in runs, f"{f} is what the board runs"

    def test_paging_limit_is_well_formed(self, backend: Backend) -> None:
        limit = backend.paging_limit(self.device)
        if limit is None:
            return
        assert isinstance(limit, PagingLimit), limit
        assert limit.max_window is None or (isinstance(limit.max_window, int) and limit.max_window >= 1), limit
        assert isinstance(limit.background, bool) and isinstance(limit.why, str) and limit.why.strip(), limit

    def test_serve_placement_is_well_formed(self, backend: Backend) -> None:
        for entry in ("0", "CPU"):
            try:
                backend.check_device_entry(entry)
            except InputError as e:
                assert entry in e.one_line()
                continue
            placed = backend.placement(entry)
            assert isinstance(placed, Placement), placed
            assert all(isinstance(k, str) and isinstance(v, str) for k, v in placed.env.items()), placed
            assert placed.device is None or isinstance(placed.device, str)
            assert all(isinstance(k, str) for k in placed.options), placed

    # --- layer-paged execution: segments of a deep stack, converted by this backend ----------------------
    def test_paged_segments_match_the_whole_model(self, kit: _Kit, backend: Backend) -> None:
        from onnx.reference import ReferenceEvaluator

        arts = kit.segments()
        x = np.random.default_rng(5).standard_normal((2, 32)).astype(np.float32)
        ref = ReferenceEvaluator(str(kit.root / "deep.onnx")).run(None, {"x": x})[0]
        assert len(arts) == 3 and all(a.suffix == backend.tensors.native[0] for a in arts)
        with kit.paged(window=2, prefetch=True) as sess:
            y = sess.run({"x": x})["y"]
            stats = sess.stats()
        assert _cosine(y, ref) >= 0.999
        assert stats["peak_resident_segments"] <= 2
        limit = backend.paging_limit(self.device)
        if limit is not None and not limit.background:  # the backend said no background loading: it was honoured
            assert stats["prefetch"] is False and any(limit.why in n for n in stats["notes"]), stats

    def test_paged_profile_reports_page_in_times_and_resident_bytes(self, kit: _Kit, backend: Backend) -> None:
        arts = kit.segments()
        x = np.ones((2, 32), np.float32)
        with kit.paged(window=2, prefetch=False) as sess:
            notes = sess.profile({"x": x}, repeat=2).notes["paging"]
        sizes = [sum(f.stat().st_size for f in backend.artifact_files(a)) for a in arts]
        assert notes["segment_bytes"] == sizes
        assert len(notes["page_in_ms_mean"]) == 3 and all(t is not None and t > 0 for t in notes["page_in_ms_mean"])
        assert notes["peak_resident_bytes"] <= sum(sorted(sizes)[-2:])
        assert notes["resident_bytes"] == sum(sizes[k] for k in notes["resident_segments"])

    def test_paged_feeds_are_checked_like_any_session(self, kit: _Kit) -> None:
        kit.segments()
        with kit.paged(window=2, prefetch=False) as sess:
            assert [s.name for s in sess.inputs] == ["x"] and [s.name for s in sess.outputs] == ["y"]
            with pytest.raises(FeedError, match="expected dtype float32, got float64"):
                sess.run({"x": np.zeros((2, 32), np.float64)})

    @pytest.mark.slow
    def test_paged_minilm_matches_the_whole_model(self, kit: _Kit, backend: Backend, tmp_path: Path) -> None:
        """The real model: six encoder layers, the attention mask carried into every segment."""
        from edgeinfer.run.paged import PagedSession
        from edgeinfer.run.segments import deploy_segments
        from edgeinfer.testing import minilm
        from edgeinfer.testing.fixtures import minilm_static_path

        if "onnx" not in backend.tensors.sources:
            pytest.skip(f"backend converts {backend.tensors.sources}; paged deploys split ONNX models")
        pytest.importorskip("transformers")
        ort = pytest.importorskip("onnxruntime")
        model = minilm_static_path()
        feeds = {k: v[:1] for k, v in minilm.tokenize(minilm.heldout_sentences(1)).items()}
        ref = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        kit.close()
        arts = deploy_segments(backend, model, tmp_path, self.scheme, None, segments=6, **self.quantize_options)
        with PagedSession.from_artifacts(backend, arts, device=self.device, window=2, prefetch=True,
                                         **self.load_options) as sess:
            for _ in range(2):
                assert _cosine(sess.run(feeds)["last_hidden_state"], ref) >= 0.999
            assert sess.stats()["peak_resident_segments"] <= 2

    # --- deploy through a board profile: what `edgeinfer deploy model.onnx --board B` asks the backend ----------
    def test_deploys_through_its_board_profile(self, kit: _Kit, backend: Backend, tmp_path: Path) -> None:
        """Deploy passes ``quantize`` only the options the backend declares (the board's target to one that
        declares ``target``) and the board runtime's scheme; the golden check passes and the bundle runs."""
        from edgeinfer.deploy.encoder import deploy
        from edgeinfer.planning.boards import get_board

        if not self.board:
            pytest.skip("set `board` to a board profile whose backend is this one (e.g. one the plugin registers)")
        if "onnx" not in backend.tensors.sources:
            pytest.skip(f"backend converts {backend.tensors.sources}; the kit deploys an ONNX model")
        b = get_board(self.board)
        assert b.backend == self.backend_name, f"board {b.name} deploys with backend {b.backend!r}"
        kit.close()
        m = kit.models["mlp"]
        result = deploy(m.path, self.board, tmp_path / "bundle", use_cache=False)
        listed = b.runtimes[b.backend_runtime or b.default_runtime].schemes
        assert result.manifest.backend == self.backend_name and result.golden["passed"]
        assert result.manifest.scheme in listed and result.manifest.scheme in backend.tensors.schemes
        assert result.manifest.board == b.name
        with edgeinfer.load(result.bundle, device=self.device, **self.load_options) as s:
            got = s.run(m.feeds)
        for name, ref in m.reference(m.feeds).items():
            out = np.asarray(got[name], np.float64)
            if result.manifest.scheme == "fp32":
                np.testing.assert_allclose(out, ref, rtol=self.rtol, atol=self.atol, err_msg=name)
            else:  # the board's scheme is lossy (fp16 ...): as close as a golden check asks
                assert _cosine(out, ref) >= 0.99, name

    # --- options and devices: refused in one line that names the bad value and what is accepted -----------
    def test_unknown_convert_option_is_an_input_error(self, kit: _Kit, backend: Backend, tmp_path: Path) -> None:
        out = tmp_path / ("x" + backend.tensors.native[0])
        with pytest.raises(InputError) as err:
            backend.quantize(kit.models["mlp"].path, self.scheme, None, out, no_such_option=1,
                             **self.quantize_options)
        _names_bad_and_accepted(err.value, "no_such_option", backend.tensors.convert_options)
        assert not out.exists()

    def test_unknown_load_option_is_an_input_error(self, kit: _Kit, backend: Backend) -> None:
        with pytest.raises(InputError) as err:
            backend.load(kit.artifact("mlp"), device=self.device, no_such_option=1, **self.load_options)
        _names_bad_and_accepted(err.value, "no_such_option", backend.tensors.open_options)

    def test_unknown_device_is_an_input_error(self, kit: _Kit, backend: Backend) -> None:
        kit.close()
        with pytest.raises(InputError) as err:
            backend.load(kit.artifact("mlp"), device="no-such-device", **self.load_options)
        line = err.value.one_line()
        assert "\n" not in line and "'no-such-device'" in line, line
        assert re.search(r"\buse\b", line), f"the error must say which devices to use: {line}"


def _names_bad_and_accepted(e: InputError, bad: str, known: tuple[str, ...]) -> None:
    line = e.one_line()
    assert "\n" not in line and repr(bad) in line, line
    if known:
        assert all(k in line for k in known), f"the error must list the accepted options {known}: {line}"
    else:
        assert "no options" in line, line


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a.ravel(), b.ravel()) / (np.linalg.norm(a) * np.linalg.norm(b)))
