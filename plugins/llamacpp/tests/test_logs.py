"""llama.cpp's log lines through the plugin's callback: errors on stderr, the rest only with --verbose."""

from __future__ import annotations


def test_llama_cpps_errors_reach_stderr_and_its_warnings_and_info_do_not(capsys):
    """ggml_log_level (ggml/include/ggml.h): DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 continues the line before.
    The levels were off by one: llama.cpp's warnings (a GGUF's "control-looking token ... probably a bug in the
    model" at every load) reached the user and its errors did not."""
    from edgeinfer_llamacpp.decoder import _log

    for level, text in ((2, b"info\n"), (3, b"warning\n"), (5, b"warning goes on\n"), (4, b"error\n"),
                        (5, b"error goes on\n"), (1, b"debug\n")):
        _log(level, text, None)
    assert capsys.readouterr().err == "error\nerror goes on\n"
