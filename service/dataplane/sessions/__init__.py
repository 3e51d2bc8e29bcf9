"""Attention sessions: a server-side key/value cache per sequence, so that a decoding client sends one step's
query, keys and values instead of the whole prefix (the Open Inference Protocol's sequence extension, as Triton's
sequence batcher reads ``sequence_id``, ``sequence_start`` and ``sequence_end``).

- ``cache``: one sequence's kept keys and values (all, or StreamingLLM's sinks plus a window);
- ``store``: the live sessions of one data plane: their budget, ownership, order, idle and LRU eviction;
- ``step``: one step as the data plane runs it (append, attend over the kept positions, diagnostics).
"""
