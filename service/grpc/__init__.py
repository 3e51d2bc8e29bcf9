"""The gRPC front end: the Open Inference Protocol's ``inference.GRPCInferenceService`` on the data plane.

Layout:

- ``server``: :class:`~service.grpc.server.GrpcServer`, the server with health checking and reflection;
- ``service``: the servicer's calls, the protocol's six and Triton's ``ModelStatistics``;
- ``stream``: Triton's ``ModelStreamInfer``, a stream of inference requests on one call, each answered in order;
- ``calls``: what every call goes through (API key, request id, status, metrics, access log);
- ``guard``: what a call passes before its message is read (its class's cap), and its message read under a
  deadline;
- ``health``: ``grpc.health.v1.Health`` and server reflection;
- ``codecs``: protobuf messages to and from the data plane's decoded requests and results;
- ``codegen``: regenerates ``generated/`` from ``protos/inference.proto``;
- ``generated``: the protobuf and gRPC stubs (committed, checked by a test);
- ``protos``: the protocol's service and messages.
"""
