"""llama.cpp's log lines through the plugin's callback: errors on stderr, the rest only with --verbose."""

from __future__ import annotations


def test_llama_cpps_lines_stay_off_stderr_and_its_first_error_names_the_failure(capsys):
    """ggml_log_level (ggml/include/ggml.h): DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 continues the line before.
    The plugin's levels were off by one: llama.cpp's warnings (a GGUF's "control-looking token ... probably a bug
    in the model" at every load) reached the user and its errors did not. Now none of its lines reach stderr
    without --verbose, and the first error line of a failed call ends up in the plugin's one-line error."""
    from edgeinfer_llamacpp.decoder import _log, clear_errors, llama_error

    clear_errors()
    for level, text in ((2, b"info\n"), (3, b"warning\n"), (5, b"warning goes on\n"),
                        (4, b"llama_model_load: error loading model: tensor 't' data is not within the file"),
                        (5, b" bounds\n"), (4, b"llama_model_load_from_file_impl: failed to load model\n"),
                        (1, b"debug\n")):
        _log(level, text, None)
    assert capsys.readouterr().err == ""
    assert llama_error() == " (llama.cpp: error loading model: tensor 't' data is not within the file bounds)"
    clear_errors()
    assert llama_error() == ""


def test_a_truncated_gguf_is_one_line_exit_2_with_llama_cpps_cause(tmp_path, capfd):
    """Also after the whole llama_cpp package was imported in this process (a probe does), whose import installs
    its own log callback: the first CI run of this test ran after one and lost llama.cpp's error line."""
    import llama_cpp  # noqa: F401 - the package's _logger takes llama.cpp's log callback
    from edgeinfer_llamacpp.convert import cached_scheme

    from edgeinfer.testing.cli import run_cli
    from edgeinfer.testing.llm import model_dir

    gguf = cached_scheme(model_dir(), "gguf:Q8_0")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(gguf.read_bytes()[: gguf.stat().st_size // 2])
    r = run_cli(capfd, "generate", str(cut), "--prompt", "hi", "--max-new-tokens", "2")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "llama.cpp:" in lines[0] and "not within the file bounds" in lines[0], lines[0]
