"""Between the wire and numpy, for the REST front end.

- ``jsonbody``: parsing a JSON body once (simdjson's tape for large number arrays, orjson otherwise);
- ``jsonscan``: a large body's tensor array read from its bytes with numpy: its shape, or its first problem;
- ``jsonfast``: the quick check of an ordinary tensor array (rectangular numbers, few inner lists) instead;
- ``jsonerrors``: where a body orjson refused holds a NaN, an infinity or a number beyond float64;
- ``tensors``: the /v1 wire forms of a tensor (nested lists, flat data, base64) to and from arrays;
- ``nested_lists``: why nested lists are not a tensor, naming the first offending element.
"""
