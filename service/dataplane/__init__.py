"""The data plane: the service's operations on numpy arrays and typed options, apart from any protocol.

Every front end (REST under ``service/http``, gRPC under ``service/grpc``) decodes its wire form, calls
in here and encodes the answer; nothing here imports a web or RPC framework or a front end.

- ``plane``: :class:`DataPlane`, one per app: engines and their cost model, admission, memory budget, scheduler;
- ``door``: the one call a request that does work makes (admission, the body's lease, scheduling, the end);
- ``attention``, ``backward``, ``analysis``, ``logits``, ``sampling``: the operations (checked, estimated,
  returned as a :class:`~service.dataplane.scheduling.Job` that runs on an engine);
- ``models``: the Open Inference Protocol's models (names, metadata, how a decoded request runs);
- ``inference``: decoded inference requests and results, and the checks of their inputs and outputs;
- ``options``: the operations' typed options;
- ``tensors``: checks on decoded arrays (limits, finiteness, the cast to the compute dtype);
- ``budget``: estimates of work, memory and answer size, and the limits they are held to;
- ``memory``: the plane's memory budget and the per-request lease;
- ``heap``: the start-up heap's freeze (``gc.freeze``) and the C heap's free memory given back after requests;
- ``admission``: who gets in (expected wait) and the compute slots;
- ``scheduling``: inline or in a worker thread, by estimated cost;
- ``context``: what the operations read of their plane (dispatcher, cost model, limits, thresholds);
- ``runtime``: the engines' start-up and readiness;
- ``auth``: API keys;
- ``timing``: the phases of a request (``timing_ms``, spans);
- ``statistics``: the statistics extension: each inference request timed and counted, Triton's answer;
- ``errors``: :class:`~service.dataplane.errors.ServiceError`, one error type with a kind.
"""

from service.dataplane.plane import DataPlane

__all__ = ["DataPlane"]
