"""Text generation for decoder models, owned once by the core for every backend.

A backend gives a :class:`~edgeinfer.contract.decoder.Decoder`: either a ``StepDecoder``
(prefill a chunk, decode one step, reset a slot, against a KV cache it owns) or a
``NativeDecoder`` (a loop the runtime runs itself). The core does the rest, the same way for
every backend:

- :mod:`edgeinfer.contract.generation` the options of one request (``GenerationOptions``)
- :mod:`.text`      tokenizer, chat template, streaming detokenization
- :mod:`.sampling`  greedy, temperature, top-k, top-p, repetition penalty, seed
- :mod:`.stopping`  EOS ids, stop strings, ``max_new_tokens``, the context limit
- :mod:`.metrics`   TTFT, prefill / decode tokens/s, TPOT percentiles, peak RSS, KV bytes
- :mod:`.generator` the loop that drives a decoder with all of the above
- :mod:`.bench`     ``edgeinfer bench`` on a decoder: the metrics per prompt length

Nothing here imports torch or a vendor SDK; ``tokenizers`` and ``jinja2`` are
imported when a tokenizer is loaded.
"""
