"""HTTP layer: routes, request/response schemas, wire codecs and error mapping."""
