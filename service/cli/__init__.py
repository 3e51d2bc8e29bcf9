"""``python -m service attention|softmax|sample``: one-off answers at a terminal.

Against a running service (``--url``, default ``$ATTENTION_URL`` or http://127.0.0.1:8000, API key from
``$ATTENTION_API_KEY``) or in this process (``--local``: the same app, no server). A table of the
weights with the diagnostics, or ``--json`` for machines. Exit status: 0 done, 1 the service refused
the request (its detail on stderr) or could not be reached, 2 a usage error.
"""
