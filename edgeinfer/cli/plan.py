"""``edgeinfer plan`` and ``edgeinfer boards``: shells over edgeinfer.planning.matrix / edgeinfer.planning.boards.

"does not fit" prints the answer and exits 1; rich is imported only to draw tables.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import click

from edgeinfer import errors
from edgeinfer.cli.output import console, emit

if TYPE_CHECKING:
    from rich.table import Table
    from rich.text import Text

    from edgeinfer.planning.chain import ChainPlan
    from edgeinfer.planning.matrix import PlanMatrix
    from edgeinfer.planning.planner import Plan

GIB = 2**30
COLOURS = {"weights": "blue", "kv_cache": "magenta", "activations": "yellow", "runtime": "cyan",
           "reserved": "bright_black"}


def _gib(n: int | float | None) -> str:
    return "-" if n is None else f"{n / GIB:.2f} GiB"


def _bar(p: Plan, width: int = 50) -> Text:
    from rich.text import Text

    cap = max(p.capacity_bytes, p.total_bytes, 1)
    t = Text()
    used = 0
    for k, v in p.breakdown.items():
        n = int(round(width * v / cap))
        used += n
        t.append("█" * n, style=COLOURS[k])
    if p.total_bytes <= p.capacity_bytes:
        t.append("░" * max(0, width - used), style="green")
    else:
        t.append(" ▲ over by " + _gib(p.total_bytes - p.capacity_bytes), style="bold red")
    return t


def _runtime_terms(rt, layers: int) -> str:
    """The fitted overhead's terms where it has more than a constant: ``137.8 MiB + 60 MiB for its 30 layers, ``."""
    if not (rt.weights_fraction or rt.layers_mib):
        return ""
    terms = [f"{rt.overhead_mib:g} MiB"] + ([f"{rt.weights_fraction:g} × weights"] if rt.weights_fraction else []) + (
        [f"{rt.layers_mib:g} MiB for its {layers} layers"] if rt.layers_mib else [])
    return " + ".join(terms) + ", "


def _ref(source: str | None) -> str:
    """The reference a source starts with (URL, repo file or docs anchor), without its explanation;
    `edgeinfer boards show` and `--json` carry the whole text."""
    text = (source or "").strip()
    cut = min((i for i in (text.find(" ("), text.find("; "), text.find(": "), text.find(" ; ")) if i > 0),
              default=len(text))
    return text[:cut]


def prefill_line(e: Any, ctx: int) -> str:
    """``prefill ≈ 1250 tok/s after 48 ms a request ±33 % (…); time to first token ≈ 0.151 s at a 128-token
    prompt, 3.32 s at 4096 (the context)``."""
    err = (f" ±{e.prefill_error_pct:g} % ({e.prefill_error_basis})" if e.prefill_error_pct is not None else
           f" (error unknown: {e.prefill_error_basis})" if e.prefill_error_basis else "")
    t0 = f" after {e.prefill_t0_ms:.0f} ms a request" if e.prefill_t0_ms else ""
    firsts = []
    for t in e.ttft_ms():
        n = t["prompt_tokens"]
        at = str(n) if firsts else f"a {n}-token prompt"
        firsts.append(f"{t['ms'] / 1000:.3g} s at {at}" + (" (the context)" if n == ctx else ""))
    paged = " (paged)" if e.prefill_tokens_per_s_unpaged is not None else ""
    rate = e.prefill_tokens_per_s
    line = f"prefill{paged} ≈ {rate:.0f}" if rate >= 100 else f"prefill{paged} ≈ {rate:.3g}"
    return f"{line} tok/s{t0}{err}" + (f"; time to first token ≈ {', '.join(firsts)}" if firsts else "")


def no_prefill(p: Plan) -> str:
    """Why a decoder's plan has no prefill estimate."""
    if not (p.board.int8_tops or p.board.fp16_tflops):
        return (f"{p.board.name} states no peak compute: `edgeinfer bench BUNDLE --json` on it, then `edgeinfer "
                "calibrate` on that report, fits its own")
    return "its speed constants have no measured prefill" if p.estimates.t0_ms is not None else p.estimates.basis


def render_plan(p: Plan) -> None:
    from rich.markup import escape
    from rich.table import Table

    con = console()
    verdict = "[bold green]FITS[/]" if p.fits else "[bold red]DOES NOT FIT[/]"
    con.print(f"{p.model.name} on {p.board.name} ({escape(p.board.title)}): {p.scheme.name} via {p.runtime}, "
              f"ctx {p.ctx}, batch {p.batch}, KV {p.kv_dtype}: {verdict}")
    for line in p.decision.lines() if p.decision else []:
        con.print(escape(line))
    t = Table(show_header=True, header_style="bold")
    t.add_column("memory")
    t.add_column("size", justify="right")
    t.add_column("share", justify="right")
    t.add_column("basis", overflow="fold")
    det = p.details
    basis = {"weights": det.weights.basis,
             "kv_cache": ("layers × (kv_lora_rank + rope dim) latent (MLA)" if p.model.kv_row else
                          "2 × layers × kv_heads × head_dim") + " × ctx × batch × "
                         f"{det.kv_cache.bytes_per_element:g} B",
             "activations": det.activations.basis,
             "runtime": f"{p.runtime}: " + _runtime_terms(det.runtime, p.model.layers) + _ref(det.runtime.source),
             "reserved": f"OS / driver: {_ref(det.reserved.source)}"}
    for k, v in p.breakdown.items():
        share = v / p.capacity_bytes * 100 if p.capacity_bytes else 0
        t.add_row(f"[{COLOURS[k]}]■[/] {k}", _gib(v), f"{share:.1f}%", basis[k])
    t.add_row("[bold]total[/]", f"[bold]{_gib(p.total_bytes)}[/]",
              f"{p.total_bytes / p.capacity_bytes * 100:.1f}%" if p.capacity_bytes else "-",
              f"board memory {_gib(p.capacity_bytes)}, usable {_gib(p.usable_bytes)}")
    con.print(t)
    con.print(_bar(p))
    hr = p.headroom_bytes
    con.print(f"headroom: {'[green]' if hr >= 0 else '[red]'}{_gib(hr)}[/]")
    served = p.to_dict()["memory"].get("served")
    if served:
        con.print(f"served (edgeinfer serve --slots {p.batch}): {_gib(served['total_bytes'])} = the decoder's "
                  f"{_gib(served['decoder_process_bytes'])} + {_gib(served['serve_processes_bytes'])} for serve's "
                  f"HTTP process and helpers ({_ref(served['source'])}); {_gib(served['in_process_total_bytes'])} "
                  "with --in-process")
    for r in p.reasons:
        con.print(f"[red]✗[/] {r}")
    e = p.estimates
    if e.decode_tokens_per_s_unpaged is not None:  # the paging line below gives the paged figure
        con.print(f"decode without paging ≈ {e.decode_tokens_per_s_unpaged:.2f} tok/s ({e.basis})")
    elif e.decode_tokens_per_s is not None:
        con.print(f"decode ≈ [bold]{e.decode_tokens_per_s:.2f} tok/s[/] {e.error_bar()} ({e.runtime}; "
                  f"{e.roofline_fraction * 100:.0f}% of the {e.roofline_tokens_per_s:.2f} tok/s bandwidth "
                  "roofline; "
                  f"t0 {e.t0_ms:.2f} ms, BW_eff {e.bw_eff_gbps} GB/s; {e.basis})")
    else:
        con.print(f"decode: no estimate ({e.basis})")
    if e.prefill_tokens_per_s is not None:
        con.print(prefill_line(e, p.ctx))
    elif not p.model.encoder:
        con.print(f"prefill: no estimate ({no_prefill(p)})")
    pg = p.details.paging
    if pg:
        stream = f"{pg.streamed_bytes_per_token / GIB:.2f} GiB/token from {pg.storage_source.split(':')[0]}"
        con.print(f"paging: {min(pg.window, pg.segments)} of {pg.segments} segments resident "
                  f"({_gib(pg.resident_weight_bytes)} of weights), {stream}"
                  + (f" at {pg.storage_gbps:g} GB/s → decode ≈ {pg.decode_tokens_per_s:.3g} tok/s, "
                     f"{pg.bound}-bound" if pg.decode_tokens_per_s is not None else "")
                  + (" (prefetch on)" if pg.prefetch else ""))
        if pg.paged_cost_pct is not None:
            cost, pct = pg.paged_cost_tokens_per_s, pg.paged_cost_pct
            con.print(f"paging costs [bold]{cost:.3g} tok/s ({pct:.1f}%)[/]: "
                      f"{pg.decode_tokens_per_s_unpaged:.3g} tok/s unpaged → {pg.decode_tokens_per_s:.3g} "
                      f"tok/s with {pg.segments} segments, {min(pg.window, pg.segments)} resident "
                      f"(embedding on the host; predicted for {p.runtime}, not measured)")
    s = p.suggestions
    if s and not p.fits:
        con.print("[bold]suggestions[/]")
        con.print(f"  largest context that fits: {s.max_ctx if s.max_ctx else 'none'}")
        con.print(f"  best scheme that fits at ctx {p.ctx}: {s.quant or 'none'}")
        con.print(f"  smallest {p.board.family} board that fits: {s.board or 'none'}")
    if s and s.paging:
        sp = s.paging
        speed = ""
        if sp.get("decode_tokens_per_s") is not None:
            speed = f" → decode ≈ {sp['decode_tokens_per_s']:.3g} tok/s"
            if sp.get("paged_cost_pct") is not None:
                speed += (f" ({sp['decode_tokens_per_s_unpaged']:.3g} tok/s unpaged: paging costs "
                          f"{sp['paged_cost_pct']:.1f}%)")
        con.print(f"[bold]paging suggested[/] ({sp['why']}): --paging {sp['window']} --segments {sp['segments']} "
                  f"({sp['window']} of {sp['segments']} segments resident, {_gib(sp['streamed_bytes_per_token'])}"
                  f"/token streamed from {sp['storage'].split(':')[0]}){speed}; `deploy --paging auto` builds it")
    if s and s.runtime:
        r = s.runtime
        con.print(f"[bold]faster here[/]: --runtime {r['runtime']} → decode ≈ {r['decode_tokens_per_s']:.3g} tok/s "
                  f"({r['speedup']:g}× this plan's estimate), total {_gib(r['total_bytes'])} (this plan "
                  f"{_gib(p.total_bytes)})")
    if s and s.activations:
        a = s.activations
        con.print(f"[bold]faster here[/]: --quant {a['quant']} (int8 activations) → decode ≈ "
                  f"{a['decode_tokens_per_s']:.3g} tok/s ({a['speedup']:g}× this plan's estimate), total "
                  f"{_gib(a['total_bytes'])} (this plan {_gib(p.total_bytes)})")
    if s and s.kv_cache:
        k = s.kv_cache
        con.print(f"[bold]smaller KV cache[/]: --kv-dtype {k['kv_dtype']} (deploy --option {k['deploy_option']}) → "
                  f"KV cache {_gib(k['kv_cache_bytes'])} (this plan {_gib(p.breakdown['kv_cache'])} {p.kv_dtype}), "
                  f"total {_gib(k['total_bytes'])}: {'fits' if k['fits'] else 'still does not fit'}"
                  + (f", decode ≈ {k['decode_tokens_per_s']:.3g} tok/s (this plan {dec:.3g})"
                     if k["decode_tokens_per_s"] and (dec := p.estimates.decode_tokens_per_s) else ""))
    if s and s.prefill_chunk:
        c = s.prefill_chunk
        n = c["prefill_chunk"]
        con.print(f"[bold]prefill faster[/]: --prefill-chunk {n} (deploy --option prefill_chunk={n}; deploy "
                  f"--paging builds it) → prefill ≈ {c['prefill_tokens_per_s']:.3g} tok/s (this plan "
                  f"{p.estimates.prefill_tokens_per_s:.3g} at {p.chunk}-token chunks), total "
                  f"{_gib(c['total_bytes'])} (this plan {_gib(p.total_bytes)})")
    cal = p.board.calibration
    if cal:
        con.print(f"[cyan]board constants from a user calibration[/] of {cal['parent']} on {len(cal['rows'])} "
                  f"measured row(s) ({cal['source']})")
    for w in p.warnings:
        con.print(f"[yellow]note:[/] {w}")


def render_matrix(m: PlanMatrix) -> None:
    from rich.markup import escape
    from rich.table import Table

    from edgeinfer.planning.details import RefusedCell

    t = Table(show_header=True, header_style="bold",
              title="plan matrix (total / capacity, decode tok/s, time to the first token of a prompt)")
    t.add_column("board", no_wrap=True, min_width=max(map(len, m.boards), default=5))
    for name in m.models:
        t.add_column(name, overflow="fold")  # wrap long reasons; never cut them with an ellipsis
    for j, b in enumerate(m.boards):
        row = [b]
        for i in range(len(m.models)):
            c = m.cell(i, j)
            if isinstance(c, RefusedCell):
                reason = c.error.removeprefix(f"board {b} ")  # the row already names the board
                row.append(f"[bright_black]{escape(reason)}[/]")
                continue
            dec, first = c.estimates.decode_tokens_per_s, c.estimates.ttft_ms()[:1]
            mark = "[green]✓[/]" if c.fits else "[red]✗[/]"
            row.append(f"{mark} {c.total_bytes / GIB:.1f}/{c.capacity_bytes / GIB:.0f} GiB"
                       + (f", {dec:.1f} tok/s" if dec else "")
                       + "".join(f", {t['ms'] / 1000:.3g} s at {t['prompt_tokens']}" for t in first)
                       + f" ({c.scheme.name})")
        t.add_row(*row)
    console().print(t)


def render_chain(c: ChainPlan) -> None:
    from rich.markup import escape
    from rich.table import Table

    con = console()
    verdict = "[bold green]FITS[/]" if c.fits else "[bold red]DOES NOT FIT[/]"
    con.print(f"{len(c.members)} models served together on {c.board.name} ({escape(c.board.title)}): {verdict}")
    t = Table(show_header=True, header_style="bold")
    for col in ("model", "scheme, ctx, batch", "weights", "kv_cache", "activations", "runtime", "total", "process"):
        t.add_column(col, overflow="fold", justify="left" if col in ("model", "process") else "right")
    d = c.to_dict()
    for m in d["models"]:
        o, mem = m["options"], m["memory"]
        t.add_row(escape(m["name"]), f"{o['quant']} via {o['runtime']}, {o['ctx']}, {o['batch']}",
                  *(_gib(mem[k]) for k in ("weights", "kv_cache", "activations", "runtime", "total_bytes")),
                  escape(", ".join(m["processes"])))
    for p in d["processes"]:
        if p["own_bytes"]:
            t.add_row(p["name"], "", "", "", "", "", _gib(p["own_bytes"]), "")
    t.add_row("reserved (OS / driver)", "", "", "", "", "", _gib(c.reserved_bytes), "")
    t.add_row("[bold]total[/]", "", "", "", "", "", f"[bold]{_gib(c.total_bytes)}[/]",
              f"board memory {_gib(c.capacity_bytes)}, usable {_gib(c.board.usable_bytes)}")
    con.print(t)
    hr = c.capacity_bytes - c.total_bytes
    con.print(f"headroom: {'[green]' if hr >= 0 else '[red]'}{_gib(hr)}[/] (each runtime's fixed overhead once per "
              "process; encoders share one worker per --devices entry, each decoder has its own)")
    for r in c.reasons:
        con.print(f"[red]✗[/] {escape(r)}")
    s = c.suggestions
    if s:
        con.print("[bold]suggestions[/] (each alone, in the room the others leave)")
        for m in s["models"]:
            asks = [f"--{k.replace('max_', '')} {m[k]}" for k in ("quant", "max_ctx") if m[k]]
            con.print(f"  {escape(m['model'])}: {' or '.join(asks) if asks else 'no smaller scheme or context fits'}")
        con.print(f"  smallest {c.board.family} board that takes the chain: {s['board'] or 'none'}")
        if s.get("in_process"):
            con.print(f"  or this board with --in-process: each decoder on a thread of serve's HTTP process, "
                      f"{s['in_process']['saving_bytes'] / 2**20:.0f} MiB less")
    for w in c.warnings:
        con.print(f"[yellow]note:[/] {escape(w)}")


@click.command("plan")
@click.argument("models", nargs=-1)
@click.option("--board", "board", help="Board name, 'all', or a path to a board YAML.")
@click.option("--quant", default=None, help="Quantization scheme (w8a8, w4a16_g128, fp16, Q4_K_M ...).")
@click.option("--ctx", "ctx_len", default=None, type=int, help="Context length in tokens (default: the model's "
              "limit, at most 2048; encoders: at most 128, the sequence deploy builds).")
@click.option("--batch", default=None, type=int, help="Sequences decoded together (default 1; in a chain serve's: "
              "32 rows for an encoder, 4 slots for a decoder).")
@click.option("--kv-dtype", default=None,
              help="KV-cache dtype (fp16, bf16, fp32, int8, q8_0, u8, q4_0; a runtime refuses one it does not keep).")
@click.option("--runtime", default=None, help="Runtime on the board (default: the board's first, in its order, "
              "that this installation can build; see docs/planner.md).")
@click.option("--prefill-chunk", type=int, default=None, metavar="N", help="Prompt tokens per prefill call "
              "(default: the runtime's; where a backend builds it into its graphs: deploy --option prefill_chunk=N).")
@click.option("--prompt", type=int, default=None, metavar="N", help="Prompt tokens whose time to the first token "
              "the plan states (default: 128 and the context).")
@click.option("--paging", type=int, default=None, metavar="W", help="Plan layer-paged: W segments resident.")
@click.option("--segments", type=int, default=None, metavar="N", help="With --paging: N segments (default: layers).")
@click.option("--storage", default=None, help="With --paging: where streamed weights come from "
              "(board, nvme, emmc, sd, dram; default: the board's, else emmc).")
@click.option("--image", default=None, metavar="WxH", help="Vision-language models: one image of this size "
              "(default 448x448; Gemma 3 always 896x896).")
@click.option("--in-process", is_flag=True, help="A chain served with `edgeinfer serve --in-process`: decoders on "
              "threads of the HTTP process, one interpreter lighter each.")
@click.option("--json", "as_json", is_flag=True, help="Print only JSON (schema edgeinfer/schemas/plan.schema.json).")
@click.option("--fleet", type=click.Path(), help="Plan a fleet file (nodes, models; docs/fleet.md) instead.")
@click.pass_context
def plan_cmd(ctx: click.Context, models: tuple[str, ...], board: str, quant: str | None, ctx_len: int | None,
             batch: int | None,
             kv_dtype: str | None, runtime: str | None, as_json: bool, paging: int | None = None,
             segments: int | None = None, storage: str | None = None, image: str | None = None,
             fleet: str | None = None, in_process: bool = False, prefill_chunk: int | None = None,
             prompt: int | None = None) -> None:
    """Will MODEL fit BOARD, how fast, and what to change if not.

    MODEL: catalog name or HF id (Qwen/Qwen3-8B), HF directory, config.json, .gguf, .onnx, .safetensors,
    or an HF id in the local Hugging Face cache. Several MODELs (or one chain .yaml file, docs/planner.md)
    on one board: do they fit served together. Exit 0 fits, 1 does not fit, 2 bad input.
    """
    from edgeinfer.planning.chain import ChainPlan
    from edgeinfer.planning.matrix import PlanMatrix, plan_models

    if fleet:
        from edgeinfer.cli.fleet import plan_fleet

        return plan_fleet(ctx, fleet, as_json)
    if not models or not board:
        raise click.UsageError("Missing argument 'MODELS...'" if not models else "Missing option '--board'")
    with _telling_host_measurement(as_json):
        answer = plan_models(models, board, quant=quant, ctx=ctx_len, batch=batch, kv_dtype=kv_dtype,
                             runtime=runtime, paging=paging, segments=segments, storage=storage, image=image,
                             in_process=in_process, prefill_chunk=prefill_chunk, prompt=prompt)
    render = (render_matrix if isinstance(answer, PlanMatrix) else render_chain if isinstance(answer, ChainPlan)
              else render_plan)
    emit(answer.to_dict(), as_json, lambda _: render(answer))
    if not answer.fits:
        ctx.exit(errors.NEGATIVE)


def _telling_host_measurement(as_json: bool) -> contextlib.AbstractContextManager:
    """Text mode: a measurement of this machine's bandwidth (the host board's, once, then cached) is said on
    stderr before it starts; with --json it runs silently."""
    if as_json:
        return contextlib.nullcontext()
    from edgeinfer.planning.host_bandwidth import telling

    return telling(lambda m: click.echo(m, err=True))


@click.group("boards", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print only JSON.")
@click.pass_context
def boards_cmd(ctx: click.Context, as_json: bool) -> None:
    """List board profiles (packaged, from plugins, and `host`)."""
    if ctx.invoked_subcommand is not None:
        return
    from edgeinfer.planning.boards import board_summaries

    with _telling_host_measurement(as_json):
        boards = board_summaries()
    emit({"boards": boards}, as_json, _render_boards)


def _render_boards(d: dict[str, Any]) -> None:
    con = console()
    con.print(_boards_table(d["boards"], wide=con.width >= 140))
    if con.width < 140:
        con.print("family and per-runtime details: edgeinfer boards show NAME (or a wider terminal)")


def _boards_table(rows: list[dict[str, Any]], wide: bool) -> Table:
    """Every board on one row; on narrow terminals the family column goes and runtimes stack one a line.
    Names never wrap; other cells fold instead of ending in an ellipsis."""
    from rich.table import Table

    t = Table(show_header=True, header_style="bold")
    t.add_column("name", no_wrap=True, min_width=max((len(r["name"]) for r in rows), default=4))
    if wide:
        t.add_column("family", no_wrap=True)
    t.add_column("backend", no_wrap=True)
    t.add_column("GiB total/usable" if wide else "GiB", no_wrap=True)
    t.add_column("BW GB/s" if wide else "GB/s", no_wrap=True, justify="right")
    t.add_column("runtime: schemes", overflow="fold", ratio=1)
    sep = "; " if wide else "\n"
    for r in rows:
        cells = [r["name"]] + ([r["family"]] if wide else []) + [
            r["backend"], f"{r['memory_gib']:.3g}/{r['usable_gib']:.3g}",
            "-" if r["bandwidth_gbps"] is None else f"{r['bandwidth_gbps']:g}",
            sep.join(f"{k}: {', '.join(v)}" for k, v in r["runtimes"].items()),
        ]
        t.add_row(*cells)
    return t


@boards_cmd.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print only JSON.")
def boards_show(name: str, as_json: bool) -> None:
    """Every fact of one board profile, with its source."""
    from edgeinfer.planning.boards import get_board

    with _telling_host_measurement(as_json):
        b = get_board(name)
    emit(b.model_dump(mode="json"), as_json, _render_board)


def _render_board(d: dict[str, Any]) -> None:
    from rich.table import Table

    con = console()
    con.print(f"[bold]{d['name']}[/] — {d['title']} (family {d['family']}, backend {d['backend']}, "
              f"{d['memory_kind']} memory)")
    t = Table(show_header=True, header_style="bold")
    t.add_column("fact", no_wrap=True)
    t.add_column("value", justify="right", no_wrap=True)
    t.add_column("source", overflow="fold")  # long URLs break across lines instead of ending in "…"
    for k, v in d.items():
        if isinstance(v, dict) and "value" in v and "source" in v:
            t.add_row(k, f"{v['value']:g}" + (" [yellow](uncertain)[/]" if v.get("uncertain") else ""), v["source"])
    con.print(t)
    for rn, r in d["runtimes"].items():
        con.print(f"runtime [bold]{rn}[/]{' (default)' if rn == d['default_runtime'] else ''}: "
                  f"{', '.join(r['schemes'])} for {'/'.join(r['kinds'])} — {r['source']}")
    for n in d["notes"]:
        con.print(f"note: {n}")
