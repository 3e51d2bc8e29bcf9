"""``python -m service.export``: write the ONNX graphs and manifest to models/."""

from service.export import main

raise SystemExit(main())
