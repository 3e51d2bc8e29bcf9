"""Engines that run attention: a small protocol, numpy and ONNX implementations, and dispatch.

Layout:

- ``base``: the engine protocol, the engine choice a response reports, and reasons fit for clients.
- ``cost``: estimated time and peak memory of a request on each engine (the model behind the budgets).
- ``cost_calibration``: the cost model's factors for this machine, where it is slower than the reference.
- ``numpy_engine``: the numpy reference engine, on a thread pool.
- ``onnx_engine``: the ONNX Runtime engine over the exported graphs of models/.
- ``dispatch``: which engine serves a request (``auto`` and the explicit choices), within the budgets.
"""
