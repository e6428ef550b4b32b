"""A lone .gguf served as it is: the KV cache serve reserves is what the planner gives for the file's metadata at
llama.cpp's f16 KV (the start-up log line said "planner: unknown": no config.json next to the file), and its scheme
is the one the file records."""

from __future__ import annotations


def test_the_planned_kv_of_a_served_gguf_is_what_llama_cpp_allocates():
    from edgeinfer_llamacpp.convert import cached_scheme

    import edgeinfer
    from edgeinfer.serve.decoder_engine import open_served_decoder, planned_kv_bytes
    from edgeinfer.testing.llm import model_dir

    gguf = cached_scheme(model_dir(), "gguf:Q8_0")
    assert not (gguf.parent / "config.json").exists()
    llm = open_served_decoder(gguf, ctx=256)  # a multiple of 256: llama.cpp allocates it as it is
    d = edgeinfer.backend("llamacpp").load_decoder(gguf, context=256, slots=4)
    try:
        assert llm.backend == "llamacpp" and llm.kv_bytes_per_element == 2.0
        assert llm.scheme == "gguf:Q8_0"  # /v1/models names what the file holds
        assert planned_kv_bytes(llm, 4) == d.kv_cache_bytes
    finally:
        d.close()
