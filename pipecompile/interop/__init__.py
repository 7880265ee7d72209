"""Other formats: every stage of an emitted directory exported to ONNX, and run in
onnxruntime as a chain."""
