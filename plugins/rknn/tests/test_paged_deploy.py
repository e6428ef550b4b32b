"""The layer-paged RKNN decoder from the command line (docs/paging.md#decoders), in the rknn-toolkit2
simulator: ``deploy --paging 1 --segments 4`` and ``--paging auto``, then ``generate`` (and ``--window``),
``bench`` and ``serve`` of the bundles.

Expected tokens are transformers' own greedy ``generate`` of tiny-qwen3 (fp32); expected segment bytes
are counted here from its config.json by formula, never read from the code under test. Each bundle is
deployed once per module through the CLI, in this process (edgeinfer.testing.cli), with decode
graphs for one sequence only (``decode_batches=1``: batched decode is test_decoder_batches.py's); later runs
reuse the conversions in the user's cache (~/.cache/edgeinfer). The golden prompt is one short line and the
context small: a process builds every graph it pages in once (the simulator's pool, by graph content: the
golden checks' graphs serve the later ``generate`` and ``bench`` here), seconds each.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from edgeinfer.model import bundle as bundle_mod
from edgeinfer.planning.boards import boards_dirs
from edgeinfer.run.generation.text import TextCodec
from edgeinfer.testing.cli import in_process_cli
from edgeinfer.testing.decoder_conformance import reference_greedy
from edgeinfer.testing.llm import model_dir
from edgeinfer.testing.serve import ServerProc

pytestmark = pytest.mark.slow

CTX = 10  # the golden check then runs 6 tokens after the 4-token prompt
PROMPT = "THE SOFTWARE IS PROVIDED"
NEW = 4
SEGMENTS = 4
# an RK3588 profile whose NPU IOMMU window holds 5 MiB: tiny-qwen3's 7.3 MiB of fp16 weights need paging
TINY_WINDOW_GIB = 5 / 1024
cli, _bind_capfd = in_process_cli()


def config() -> dict:
    return json.loads((model_dir() / "config.json").read_text())


def segment_bytes(c: dict) -> list[int]:
    """fp16 weight bytes of the 4 one-layer segments: a Qwen3 block each; the last adds the final norm
    and the (tied, copied to the NPU) head; the embedding stays on the host."""
    h, d, i = c["hidden_size"], c["head_dim"], c["intermediate_size"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    block = h * q + 2 * h * kv + q * h + 2 * d + 3 * h * i + 2 * h
    return [2 * block] * 3 + [2 * (block + h + c["vocab_size"] * h)]


def resident(seg: list[int], window: int) -> int:
    """Largest resident set of the schedule without prefetch: the first W-1 pinned, one streaming slot."""
    return sum(seg[:window - 1]) + max(seg[window - 1:])


def deploy(out, *args: str) -> subprocess.CompletedProcess:
    golden = out.parent / "golden.txt"
    golden.write_text(PROMPT + "\n")
    r = cli("deploy", str(model_dir()), "--ctx", str(CTX), "--golden-inputs", str(golden), "--option",
            "decode_batches=1", "-o", str(out), *args)
    assert r.returncode == 0, r.stderr
    return r


@pytest.fixture(scope="module")
def tiny_window_board(tmp_path_factory):
    data = yaml.safe_load((boards_dirs()[0] / "rk3588-8g.yaml").read_text())
    data["name"] = "rk3588-tiny-window"
    data["npu_window_gib"]["value"] = TINY_WINDOW_GIB
    path = tmp_path_factory.mktemp("boards") / "rk3588-tiny-window.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


_DEPLOYED: dict[str, tuple[Path, subprocess.CompletedProcess]] = {}


def deployed(name: str, tmp_path_factory, *args: str) -> tuple[Path, subprocess.CompletedProcess]:
    """(bundle, the deploy's CompletedProcess), deployed by the first test that needs it (in-process ``cli``
    needs that test's capfd, so these fixtures cannot be module-scoped), the same one for every later test."""
    if name not in _DEPLOYED:
        out = tmp_path_factory.mktemp(name) / f"tiny-qwen3-{name}"
        _DEPLOYED[name] = out, deploy(out, *args)
    return _DEPLOYED[name]


@pytest.fixture
def paged(tmp_path_factory):
    return deployed("paged", tmp_path_factory, "--board", "rk3588-8g", "--paging", "1", "--segments", str(SEGMENTS))


@pytest.fixture
def auto(tmp_path_factory, tiny_window_board):
    return deployed("auto", tmp_path_factory, "--board", str(tiny_window_board), "--paging", "auto")


@pytest.fixture
def unpaged(tmp_path_factory):
    """``--paging auto`` where the plan needs no paging: the unpaged bundle."""
    return deployed("unpaged", tmp_path_factory, "--board", "rk3588-8g", "--paging", "auto")


@pytest.fixture(scope="module")
def reference() -> list[int]:
    return reference_greedy(model_dir(), TextCodec(model_dir()).encode(PROMPT), NEW)


def manifest(bundle) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


_UNPAGED: dict = {}


def unpaged_run(bundle) -> dict:
    """``generate`` of the unpaged bundle, run once for the tests that compare with it."""
    if not _UNPAGED:
        _UNPAGED.update(generate(bundle))
    return _UNPAGED


def generate(bundle, *args: str) -> dict:
    r = cli("generate", str(bundle), "--prompt", PROMPT, "--max-new-tokens", str(NEW), "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_paged_deploy_records_segments_window_and_the_plans_figures(paged):
    bundle, run = paged
    pg = manifest(bundle)["decoder"]["paging"]
    seg = segment_bytes(config())
    assert (pg["segments"], pg["window"], pg["max_window"]) == (SEGMENTS, 1, SEGMENTS)
    assert pg["predicted"]["segment_bytes"] == pytest.approx(seg, rel=0.01)
    assert pg["predicted"]["npu_resident_bytes"] == pytest.approx(resident(seg, 1), rel=0.01)
    golden = manifest(bundle)["decoder"]["golden"]
    assert golden["passed"] and golden["ran"] and golden["device"] == "simulator"
    schema = json.loads((Path(bundle_mod.__file__).parents[1] / "schemas" / "manifest.schema.json").read_text())
    jsonschema.validate(manifest(bundle), schema)
    assert bundle_mod.verify(bundle)["ok"]
    assert "--paging 1 --segments 4: 4 segments, 1 resident" in run.stderr


def test_paging_auto_takes_the_plans_largest_window_that_fits(auto):
    bundle, run = auto
    pg = manifest(bundle)["decoder"]["paging"]
    seg, limit = segment_bytes(config()), TINY_WINDOW_GIB * 2**30
    want = max(w for w in range(1, SEGMENTS) if resident(seg, w) <= limit)  # one layer per segment
    assert (pg["segments"], pg["window"], pg["max_window"]) == (SEGMENTS, want, want)
    assert pg["chosen_by"].startswith("--paging auto") and "--paging auto" in run.stderr


def test_paging_auto_builds_unpaged_when_the_plan_needs_no_paging(unpaged):
    bundle, run = unpaged
    assert "paging" not in manifest(bundle)["decoder"]
    assert "the plan needs no paging" in run.stderr and "building it unpaged" in run.stderr


@pytest.mark.parametrize("which", ["paged", "auto"])
def test_paged_bundles_give_the_unpaged_bundles_tokens_and_transformers(which, request, unpaged, reference):
    bundle, _ = request.getfixturevalue(which)
    got = generate(bundle)
    assert got["token_ids"] == reference
    assert unpaged_run(unpaged[0])["token_ids"] == reference
    window = manifest(bundle)["decoder"]["paging"]["window"]
    assert got["paging"]["window"] == window and got["paging"]["segments"] == SEGMENTS


def test_generate_window_overrides_the_recorded_window(paged, reference):
    got = generate(paged[0], "--window", "3")
    assert got["token_ids"] == reference
    assert got["paging"]["window"] == 3 and got["paging"]["pinned"] == 2


@pytest.mark.parametrize("bundle, window, match", [
    ("paged", "5", "has 4 segments; pass a window of 1..4"),
    ("auto", "3", "do not fit board rk3588-tiny-window per its plan"),
    ("unpaged", "1", "is not one: drop --window"),
])
def test_generate_window_refusals_are_one_line(bundle, window, match, request):
    path, _ = request.getfixturevalue(bundle)
    r = cli("generate", str(path), "--prompt", PROMPT, "--max-new-tokens", "1", "--window", window)
    assert r.returncode == 2, r.stderr
    assert match in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_bench_reports_page_ins_page_in_times_and_resident_bytes_against_the_plan(paged):
    r = cli("bench", str(paged[0]), "--prompt-lengths", "4", "--new-tokens", "2", "--repeat", "1", "--json")
    assert r.returncode == 0, r.stderr
    pg = json.loads(r.stdout)["paging"]
    seg = segment_bytes(config())
    assert (pg["window"], pg["segments"]) == (1, SEGMENTS)
    # window 1: every pass (the prefill, then one decode per further token) pages in all four segments
    assert pg["generated_tokens"] == 2 * 2 and pg["page_ins_per_token"] == SEGMENTS
    assert len(pg["page_in_ms_mean"]) == SEGMENTS and all(ms > 0 for ms in pg["page_in_ms_mean"])
    assert any(n.startswith("simulator figures: a page-in takes the segment graph") for n in pg["notes"])
    assert pg["measured_resident_bytes"] == pytest.approx(resident(seg, 1), rel=0.01)
    assert pg["predicted_resident_bytes"] == pytest.approx(resident(seg, 1), rel=0.01)
    assert pg["resident_error_pct"] == pytest.approx(0, abs=1)
    # the decode-speed self-check predicts for the paged bundle at the window it ran, not the unpaged model
    [cmp] = json.loads(r.stdout)["self_check"]["comparisons"]
    plan_at = ("plan", str(model_dir()), "--board", "rk3588-8g", "--ctx", str(cmp["ctx"]), "--json")
    paged_est = json.loads(cli(*plan_at, "--paging", "1", "--segments", str(SEGMENTS)).stdout)["estimates"]
    unpaged_est = json.loads(cli(*plan_at).stdout)["estimates"]
    assert cmp["predicted_decode_tokens_per_s"] == paged_est["decode_tokens_per_s"]
    assert paged_est["decode_tokens_per_s"] < unpaged_est["decode_tokens_per_s"]


def test_serve_streams_a_paged_bundle_through_the_openai_client(paged, unpaged, tmp_path):
    openai = pytest.importorskip("openai")
    bundle = paged[0]
    want = unpaged_run(unpaged[0])["text"]  # its tokens are transformers' (the test above)
    with ServerProc([bundle], "--slots", "1", log=tmp_path / "log") as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        chunks = c.completions.create(model=bundle.name, prompt=PROMPT, max_tokens=NEW, stream=True, temperature=0)
        text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == want
